"""End to end: worlds, frames (unary and stream), queries, pair lists, subscribe, RemoteWorld, asyncio.

The service must give exactly what a local sapcore.World gives for the same frames.
"""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from sapcore import World, WorldConfig
from sapgrid.client import AsyncClient, Client
from sapgrid.tools.remote_world import RemoteWorld
from sapgrid.client.errors import AlreadyExists, InvalidArgument, NotFound
from service_helpers import assert_same_pairs, random_boxes

CFG2 = WorldConfig(dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
CFG3 = WorldConfig(dims=3, bounds=(0, 0, 0, 100, 100, 100), cells=(3, 3, 3))


def _frames(rng, n=300, ticks=8, dims=2):
    """A scripted sequence of frames: add n, then moves, removes and adds."""
    ids = np.arange(1, n + 1, dtype=np.uint64)
    boxes = random_boxes(rng, n, dims)
    frames = [dict(add_ids=ids, add_boxes=boxes)]
    live = ids.copy()
    next_id = n + 1
    for _ in range(ticks):
        move = rng.choice(live, size=len(live) // 2, replace=False)
        rem = np.setdiff1d(live, move)[:5]
        live = np.setdiff1d(live, rem)
        add = np.arange(next_id, next_id + 4, dtype=np.uint64)
        next_id += 4
        live = np.concatenate([live, add])
        frames.append(dict(remove_ids=rem, update_ids=move, update_boxes=random_boxes(rng, len(move), dims),
                           add_ids=add, add_boxes=random_boxes(rng, 4, dims)))
    return frames


def test_default_world_is_ready(client):
    names = [w.name for w in client.list_worlds()]
    assert "default" in names
    info = client.get_world("default")
    assert info.config.dims == 2


def test_world_lifecycle(client, world_name):
    info = client.create_world(world_name, CFG2)
    assert info.name == world_name and info.config.cells == (4, 4) and info.objects == 0
    assert world_name in [w.name for w in client.list_worlds()]
    with pytest.raises(AlreadyExists):
        client.create_world(world_name, CFG2)
    again = client.create_world(world_name, CFG2, if_not_exists=True)
    assert again.name == world_name
    client.delete_world(world_name)
    assert world_name not in [w.name for w in client.list_worlds()]
    with pytest.raises(NotFound):
        client.get_world(world_name)
    with pytest.raises(NotFound):
        client.delete_world(world_name)


def test_create_world_server_picks_cells(client, world_name):
    info = client.create_world(world_name, dims=3, bounds=(0, 0, 0, 50, 50, 50), expected_objects=5000)
    assert len(info.config.cells) == 3 and all(c >= 1 for c in info.config.cells)
    client.delete_world(world_name)


@pytest.mark.parametrize("kwargs, field", [
    (dict(dims=4, bounds=(0, 0, 1, 1), cells=(1, 1)), "config"),
    (dict(dims=2, bounds=(0, 0, 1), cells=(1, 1)), "config"),
    (dict(dims=2, bounds=(5, 0, 1, 1), cells=(1, 1)), "config"),
    (dict(dims=2, bounds=(0, 0, 1, 1), cells=(0, 1)), "config"),
])
def test_bad_world_config_is_invalid_argument(client, world_name, kwargs, field):
    with pytest.raises(InvalidArgument) as ei:
        client.create_world(world_name, **kwargs)
    assert ei.value.field == field
    assert world_name not in [w.name for w in client.list_worlds()]


def test_bad_world_name_is_invalid_argument(client):
    with pytest.raises(InvalidArgument) as ei:
        client.create_world("bad name/with spaces", CFG2)
    assert ei.value.field == "name"


@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["2d", "3d"])
def test_stream_matches_local_world(client, world_name, rng, cfg):
    frames = _frames(rng, dims=cfg.dims)
    local = World(cfg)
    client.create_world(world_name, cfg)
    with client.stream(world_name) as s:
        for i, f in enumerate(frames):
            want = local.step(**f)
            got = s.step(**f)
            assert got.seq == i + 1 and got.frame == i + 1 and got.world == world_name
            assert_same_pairs(got.created, want.created)
            assert_same_pairs(got.deleted, want.deleted)
            assert got.stats.pairs == want.stats.pairs == local.pair_count
            assert got.stats.objects == local.object_count
    assert_same_pairs(client.pairs(world_name), local.pairs())
    info = client.get_world(world_name)
    assert (info.objects, info.pairs, info.frames) == (local.object_count, local.pair_count, len(frames))
    assert info.last_frame is not None and info.last_frame.pairs == local.pair_count
    region = [10, 10, 60, 60] if cfg.dims == 2 else [10, 10, 10, 60, 60, 60]
    np.testing.assert_array_equal(client.query(world_name, region), local.query(region))
    ids, boxes = client.query(world_name, region, include_boxes=True)
    np.testing.assert_array_equal(boxes, local.boxes(ids))
    client.delete_world(world_name)


def test_unary_frames_and_pipelined_stream(client, world_name, rng):
    frames = _frames(rng, ticks=5)
    local = World(CFG2)
    client.create_world(world_name, CFG2)
    want = [local.step(**f) for f in frames]
    d0 = client.step(world_name, seq=77, **frames[0])
    assert d0.seq == 77
    assert_same_pairs(d0.created, want[0].created)
    with client.stream(world_name) as s:
        seqs = [s.send(seq=100 + i, **f) for i, f in enumerate(frames[1:])]   # all in flight at once
        got = [s.recv() for _ in seqs]
    assert [d.seq for d in got] == seqs
    for g, w in zip(got, want[1:]):
        assert_same_pairs(g.created, w.created)
        assert_same_pairs(g.deleted, w.deleted)
    client.delete_world(world_name)


def test_filtering_fields_travel(client, world_name):
    client.create_world(world_name, CFG2)
    boxes = np.array([[0, 0, 2, 2], [1, 1, 3, 3], [1, 0, 2, 3], [0, 1, 3, 2]], np.float32)
    d = client.step(world_name, add_ids=[1, 2, 3, 4], add_boxes=boxes, add_category=[1, 2, 1, 1],
                    add_mask=[0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0], add_static=[True, True, False, False])
    local = World(CFG2)
    want = local.step(add_ids=[1, 2, 3, 4], add_boxes=boxes, add_category=np.array([1, 2, 1, 1], np.uint32),
                      add_mask=np.array([0xFFFFFFFF] * 3 + [0], np.uint32),
                      add_static=np.array([True, True, False, False]))
    assert_same_pairs(d.created, want.created)
    assert (1, 2) not in {tuple(map(int, r)) for r in d.created}     # both static
    client.delete_world(world_name)


def test_pair_pages_and_chunks_cover_all_pairs(client, world_name, rng):
    client.create_world(world_name, CFG2)
    n = 800
    client.step(world_name, add_ids=np.arange(n), add_boxes=random_boxes(rng, n, side=60, size=6))
    full = client.pairs(world_name)
    assert len(full) > 50
    assert_same_pairs(client.pairs(world_name, chunk_size=7), full)
    pages, token = [], ""
    while True:
        page, token = client.list_pairs(world_name, page_size=13, page_token=token)
        pages.append(page)
        if not token:
            break
    assert_same_pairs(np.concatenate(pages), full)
    with pytest.raises(InvalidArgument) as ei:
        client.list_pairs(world_name, page_token="garbage")
    assert ei.value.field == "page_token"
    client.delete_world(world_name)


def test_empty_world_queries(client, world_name):
    client.create_world(world_name, CFG2)
    assert client.pairs(world_name).shape == (0, 2)
    assert len(client.query(world_name, [0, 0, 100, 100])) == 0
    page, token = client.list_pairs(world_name)
    assert page.shape == (0, 2) and token == ""
    d = client.step(world_name)         # an empty frame is fine
    assert d.created.shape == (0, 2) and d.frame == 1
    client.delete_world(world_name)


def test_subscribe_sees_every_delta(client, world_name, rng):
    frames = _frames(rng, ticks=6)
    client.create_world(world_name, CFG2)
    sub = client.subscribe(world_name, timeout=120)
    seen = []
    ready = threading.Event()

    def watch():
        ready.set()
        for d in sub:
            seen.append(d)
            if len(seen) == len(frames):
                break

    t = threading.Thread(target=watch)
    t.start()
    ready.wait()
    # The subscription is registered once GetWorld shows it (no sleeps).
    while client.get_world(world_name).subscribers < 1:
        pass
    with client.stream(world_name) as s:
        sent = [s.step(**f) for f in frames]
    t.join(120)
    sub.cancel()
    assert [d.seq for d in seen] == [d.seq for d in sent]
    for a, b in zip(seen, sent):
        assert_same_pairs(a.created, b.created)
        assert_same_pairs(a.deleted, b.deleted)
    client.delete_world(world_name)


def test_subscribe_ends_with_not_found_when_the_world_is_deleted(client, world_name):
    client.create_world(world_name, CFG2)
    sub = client.subscribe(world_name, timeout=60)
    while client.get_world(world_name).subscribers < 1:
        pass
    client.delete_world(world_name)
    with pytest.raises(NotFound, match="was deleted"):
        list(sub)


def test_a_long_unknown_name_gets_a_short_not_found(client):
    name = "x" * 10_000
    for call in (lambda: client.get_world(name), lambda: client.step(name, 1, remove_ids=[1]),
                 lambda: client.pairs(name)):
        with pytest.raises(NotFound) as ei:
            call()
        assert len(ei.value.message) < 200 and "10000 characters" in ei.value.message


def test_subscribe_unknown_world(client):
    with pytest.raises(NotFound):
        next(iter(client.subscribe("no-such-world", timeout=30)))


def test_remote_world_has_the_world_interface(server, rng):
    frames = _frames(rng, ticks=4)
    local = World(CFG2)
    with RemoteWorld.connect(server.address, CFG2) as remote:
        name = remote.name
        for f in frames:
            want, got = local.step(**f), remote.step(**f)
            assert_same_pairs(got.created, want.created)
            assert_same_pairs(got.deleted, want.deleted)
            assert type(got.stats).__name__ == "FrameStats"
        assert_same_pairs(remote.pairs(), local.pairs())
        np.testing.assert_array_equal(remote.query([0, 0, 50, 50]), local.query([0, 0, 50, 50]))
        np.testing.assert_array_equal(remote.ids(), local.ids())
        assert remote.object_count == local.object_count and remote.pair_count == local.pair_count
        assert remote.frames == len(frames)
    with Client(server.address) as c:
        assert name not in [w.name for w in c.list_worlds()]       # deleted on close


def test_remote_world_raises_frame_errors_like_local(server):
    from sapcore.errors import FrameError

    with RemoteWorld.connect(server.address, CFG2, name=None) as remote:
        remote.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        with pytest.raises(FrameError) as ei:
            remote.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        assert ei.value.field == "add_ids" and ei.value.index == 0
        remote.step(update_ids=[1], update_boxes=[[1, 1, 2, 2]])      # the stream goes on


def test_async_client(server, world_name, rng):
    frames = _frames(rng, ticks=4)
    local = World(CFG2)
    want = [local.step(**f) for f in frames]

    async def main():
        async with AsyncClient(server.address) as c:
            await c.create_world(world_name, CFG2)
            deltas = []
            async with c.stream(world_name) as s:
                for f in frames[:-1]:
                    deltas.append(await s.step(**f))
            deltas.append(await c.step(world_name, **frames[-1]))
            pairs = await c.pairs(world_name)
            page, _ = await c.list_pairs(world_name, page_size=1_000_000)
            ids = await c.query(world_name, [0, 0, 100, 100])
            infos = await c.list_worlds()
            with pytest.raises(InvalidArgument):
                async with c.stream(world_name) as s:
                    await s.step(add_ids=[10**6], add_boxes=[[1, 1, 0, 0]])
            await c.delete_world(world_name)
            return deltas, pairs, page, ids, infos

    deltas, pairs, page, ids, infos = asyncio.run(main())
    for g, w in zip(deltas, want):
        assert_same_pairs(g.created, w.created)
    assert_same_pairs(pairs, local.pairs())
    assert_same_pairs(page, local.pairs())
    np.testing.assert_array_equal(ids, local.ids())
    assert world_name in [w.name for w in infos]


def test_async_subscribe(server, world_name):
    async def main():
        async with AsyncClient(server.address) as c:
            await c.create_world(world_name, CFG2)
            got = []

            async def watch():
                async for d in c.subscribe(world_name):
                    got.append(d)
                    if len(got) == 2:
                        return

            task = asyncio.create_task(watch())
            while (await c.get_world(world_name)).subscribers < 1:
                await asyncio.sleep(0)
            await c.step(world_name, seq=1, add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
            await c.step(world_name, seq=2, remove_ids=[2])
            await asyncio.wait_for(task, 60)
            await c.delete_world(world_name)
            return got

    got = asyncio.run(main())
    assert [d.seq for d in got] == [1, 2]
    assert got[0].created.tolist() == [[1, 2]] and got[1].deleted.tolist() == [[1, 2]]


def test_a_stream_never_writes_into_a_world_created_again_under_its_name(client, world_name):
    first = client.create_world(world_name, CFG2)
    with client.stream(world_name) as s:
        s.step(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]])
        client.delete_world(world_name)
        second = client.create_world(world_name, CFG2)
        assert second.generation > first.generation > 0
        with pytest.raises(NotFound, match="was deleted since this stream wrote to it"):
            s.step(add_ids=[7], add_boxes=[[0, 0, 1, 1]])
    info = client.get_world(world_name)
    assert info.objects == 0 and info.frames == 0 and info.generation == second.generation
    with client.stream(world_name) as s2:                      # a new stream writes to the new world
        assert s2.step(add_ids=[7], add_boxes=[[0, 0, 1, 1]]).frame == 1
    client.delete_world(world_name)
