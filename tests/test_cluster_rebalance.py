"""`sapgrid cluster rebalance` on a real cluster (replica processes, Debian's HAProxy, see
test_cluster_scale.py): scale 3 -> 4 while every world streams frames through the proxy with resuming
writer streams; a move that fails half-way leaves the bucket's worlds on their old owner, unfrozen."""
import io
import threading

import numpy as np
import pytest

from sapgrid.layout import pairs_digest
from sapgrid.server.cluster import Ring, bucket
from sapgrid.tools.cluster import rebalance
from sapgrid.tools.spawn import free_port
from test_cluster_scale import HAPROXY, SIDE, Cluster, Mover, _held, _world_info


def _check_world(client, members, m: Mover, owner: str) -> None:
    """The world is on its owner only, has applied exactly the frames sent, and its pairs are the oracle's."""
    held = {r: _held(r) for r in members}
    assert [r for r in members if m.name in held[r]] == [owner], m.name
    info = _world_info(owner, m.name)
    oracle = m.oracle()
    assert info.frames == m.sent, (m.name, info.frames, m.sent)
    assert info.writers == {"game": m.sent}, m.name
    assert not info.frozen
    assert info.pairs_digest == pairs_digest(oracle)
    assert np.array_equal(client.pairs(m.name), oracle), m.name


@pytest.fixture
def cluster3():
    assert HAPROXY, "haproxy is not installed: run scripts/setup.d/70-haproxy.sh"
    c = Cluster(3)
    try:
        c.start_proxy(c.members)
        yield c
    finally:
        c.close()


@pytest.fixture
def durable3():
    assert HAPROXY, "haproxy is not installed: run scripts/setup.d/70-haproxy.sh"
    c = Cluster(3, durable=True)
    try:
        c.start_proxy(c.members)
        yield c
    finally:
        c.close()


def test_scale_3_to_4_while_clients_stream(durable3):
    """Durable replicas: after the move, kill -9 of the new replica and of one that gave worlds away, and
    their restart: the moved worlds come back on the new one only, and their streams go on."""
    from sapgrid.client import Client

    c = durable3
    old = list(c.members)
    movers = [Mover(f"match-{i:02d}", seed=100 + i) for i in range(24)]
    with Client(c.bind, timeout=30) as client:
        for m in movers:
            client.create_world(m.name, bounds=(0, 0, SIDE, SIDE), cells=(4, 4))
        streams = {m.name: client.stream(m.name, writer="game", resume=True, resume_deadline=60) for m in movers}
        try:
            def round_() -> None:
                for m in movers:
                    streams[m.name].send(**m.frame())
                for m in movers:
                    d = streams[m.name].recv()
                    assert d.frame == m.sent + 1, (m.name, d.frame, m.sent)   # none lost, none applied twice
                    m.answered()

            for _ in range(3):
                round_()
            # a fourth replica: the member file first (every replica reads it), then the replica, then
            # the proxy with backends for both lists and the old routing (no world changes route yet)
            new = f"127.0.0.1:{free_port()}"
            c.set_members(old + [new])
            c.start(new)
            c.start_proxy(old + [new], map_from=old)
            ring4 = Ring(old + [new])
            moving = [m for m in movers if ring4.owner(m.name) == new]
            assert moving and len(moving) < len(movers)

            out = io.StringIO()
            result = {}
            mover = threading.Thread(target=lambda: result.update(rc=rebalance(old, old + [new], [c.admin], out=out)))
            mover.start()
            rounds = 0
            while mover.is_alive() or rounds < 3:        # the clients stream while the worlds move
                round_()
                rounds += 1
                assert rounds < 500, "the rebalance did not end"
            mover.join(60)
            assert result["rc"] == 0, out.getvalue()
            for _ in range(2):
                round_()
            for m in moving:
                assert f"{m.name}: {ring_owner(old, m.name)} -> {new}" in out.getvalue()
                assert streams[m.name].reconnects >= 1       # its stream was moved, not left behind
            # the moved worlds are durable on the new replica, and gone for good from the old one
            giver = ring_owner(old, moving[0].name)
            for r in (new, giver):
                c.replicas[r].proc.kill()
                c.replicas[r].wait(10)
                c.start(r)
            for _ in range(2):
                round_()
        finally:
            for s in streams.values():
                s.close()
        for m in movers:
            _check_world(client, old + [new], m, ring4.owner(m.name))
    assert {ring4.owner(m.name) for m in movers} == set(old + [new])


def ring_owner(members, name: str) -> str:
    return Ring(members).owner(name)


def test_a_failed_move_leaves_the_bucket_on_its_old_owner_unfrozen(cluster3):
    """Two worlds of one bucket move to the new replica, whose message limit (256 KiB) is smaller than
    the second world's snapshot chunks: the first restore succeeds, the second is refused, so the first
    copy is deleted from the new replica and both stay on their old owner, unfrozen, with their frames,
    reached through the proxy; the other buckets move."""
    from sapgrid.client import Client

    c = cluster3
    old = list(c.members)
    new = f"127.0.0.1:{free_port()}"
    ring4 = Ring(old + [new])
    by_bucket: dict = {}
    for i in range(20000):                        # two names of one bucket that moves to the new replica
        name = f"duel-{i}"
        if ring4.owner(name) == new:
            by_bucket.setdefault(bucket(name), []).append(name)
            if len(by_bucket[bucket(name)]) == 2:
                pair = sorted(by_bucket[bucket(name)])       # a bucket's worlds move in name order
                break
    others = [f"solo-{i}" for i in range(12)]
    movers = [Mover(n, seed=i) for i, n in enumerate(pair + others)]
    big_ids = np.arange(1000, 31000, dtype=np.uint64)      # 30,000 objects on a lattice: a snapshot of ~1 MB
    k = np.arange(len(big_ids))
    lo = np.stack([200 + 3.0 * (k % 200), 200 + 3.0 * (k // 200)], axis=1)
    big_boxes = np.hstack([lo, lo + 1]).astype(np.float32)
    # (120 s: from a fresh checkout, a replica may compile kernels for its first frames, e.g. the big add,
    # while the others do the same on the 2 cores)
    with Client(c.bind, timeout=120) as client:
        for m in movers:
            client.create_world(m.name, bounds=(0, 0, SIDE, SIDE), cells=(4, 4))
            with client.stream(m.name, writer="game") as s:
                for _ in range(3):
                    s.step(**m.frame())
                    m.answered()
        client.step(pair[1], add_ids=big_ids, add_boxes=big_boxes)
        before = client.pairs(pair[1])
        c.set_members(old + [new])
        c.start(new, "--max-message-bytes", str(256 * 1024))
        c.start_proxy(old + [new], map_from=old)
        out = io.StringIO()
        assert rebalance(old, old + [new], [c.admin], out=out) == 1
        text = out.getvalue()
        assert f"bucket {bucket(pair[0])}: move failed (RESOURCE_EXHAUSTED" in text, text
        assert f"{pair[0]}: its copy on {new} deleted" in text, text
        src = ring_owner(old, pair[0])
        assert not set(pair) & set(_held(new))
        for name, frames in ((pair[0], 3), (pair[1], 4)):
            info = _world_info(src, name)
            assert not info.frozen and info.frames == frames
        assert np.array_equal(client.pairs(pair[1]), before)
        m = movers[0]                              # through the proxy the bucket still reaches the old owner
        with client.stream(m.name, writer="game", resume=True) as s:
            assert s.step(**m.frame()).frame == 4
            m.answered()
        assert np.array_equal(client.pairs(m.name), m.oracle())
        for m in movers[2:]:                       # the other buckets moved
            owner = ring4.owner(m.name)
            assert m.name in _held(owner)
            assert _world_info(owner, m.name).writers == {"game": 3}
            if owner == new:
                assert f"{m.name}: {ring_owner(old, m.name)} -> {new}" in text


def test_rebalance_refuses_to_start_when_a_replica_is_down(cluster3):
    from sapgrid.client import Client

    c = cluster3
    old = list(c.members)
    with Client(c.bind, timeout=30) as client:
        for i in range(6):
            client.create_world(f"w{i}")
    down = f"127.0.0.1:{free_port()}"            # a new member that was never started
    out = io.StringIO()
    assert rebalance(old, old + [down], [c.admin], out=out) == 2
    assert f"replica {down} unreachable" in out.getvalue()
    for r in old:
        for name in _held(r):
            assert not _world_info(r, name).frozen
    assert sum(len(_held(r)) for r in old) == 6


def test_rebalance_finishes_a_move_that_was_interrupted(cluster3):
    """A move stopped after the restore (the old copy frozen, the new owner's copy restored, the proxy not
    yet pointed at it): the next rebalance routes the bucket to the new owner and deletes the frozen
    copy; a world that is not frozen on both is reported and left alone."""
    from sapgrid.client import Client

    c = cluster3
    old = list(c.members)
    new = f"127.0.0.1:{free_port()}"
    ring4 = Ring(old + [new])
    names = [n for n in (f"cut-{i}" for i in range(400)) if ring4.owner(n) == new][:2]
    movers = [Mover(n, seed=i) for i, n in enumerate(names)]
    with Client(c.bind, timeout=30) as client:
        for m in movers:
            client.create_world(m.name, bounds=(0, 0, SIDE, SIDE), cells=(4, 4))
            with client.stream(m.name, writer="game") as s:
                s.step(**m.frame())
                m.answered()
        c.set_members(old + [new])
        c.start(new)
        c.start_proxy(old + [new], map_from=old)
        interrupted, conflict = movers
        for m, freeze in ((interrupted, True), (conflict, False)):
            src = ring_owner(old, m.name)
            with Client(src, timeout=30) as s, Client(new, timeout=30) as d:
                if freeze:
                    s.freeze(m.name)
                d.restore(s.snapshot(m.name), name=m.name)
        out = io.StringIO()
        assert rebalance(old, old + [new], [c.admin], out=out) == 1
        text = out.getvalue()
        assert f"{interrupted.name}: {ring_owner(old, interrupted.name)} -> {new} (the end of an earlier move" in text
        assert f"{conflict.name}: held by both" in text, text
        assert interrupted.name not in _held(ring_owner(old, interrupted.name))
        assert conflict.name in _held(ring_owner(old, conflict.name)) and conflict.name in _held(new)
        with client.stream(interrupted.name, writer="game", resume=True) as s:   # through the proxy: the new owner
            assert s.step(**interrupted.frame()).frame == 2
            interrupted.answered()
        _check_world(client, old + [new], interrupted, new)


def test_rebalance_stops_when_the_new_replica_refuses_every_world(cluster3):
    """The new replica does not have the new member list (here: it was taken away again), so it owns no
    world and refuses every restore: three buckets fail in a row, the rebalance stops, and every world
    is still on its old owner, unfrozen."""
    from sapgrid.client import Client

    c = cluster3
    old = list(c.members)
    new = f"127.0.0.1:{free_port()}"
    # 30 worlds or more, until at least three buckets of them go to the new replica (the ring depends on the
    # members' ports: 30 names alone left only two such buckets in ~1% of runs, and nothing to stop at)
    ring4, names, moving = Ring(old + [new]), [], set()
    while len(names) < 30 or len(moving) < 3:
        names.append(f"keep-{len(names)}")
        if ring4.owner(names[-1]) == new:
            moving.add(bucket(names[-1]))
    with Client(c.bind, timeout=30) as client:
        for n in names:
            client.create_world(n)
    c.set_members(old + [new])
    c.start(new)
    c.set_members(old)                              # every replica reads the old list again
    out = io.StringIO()
    assert rebalance(old, old + [new], [c.admin], out=out) == 1
    text = out.getvalue()
    assert "3 buckets in a row failed: stopping" in text, text
    assert text.count("FAILED_PRECONDITION") == 3 and "belongs to replica" in text
    assert _held(new) == {}
    held = {r: _held(r) for r in old}
    for n in names:
        assert [r for r in old if n in held[r]] == [ring_owner(old, n)]
        assert not _world_info(ring_owner(old, n), n).frozen
