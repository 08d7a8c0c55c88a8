"""The Python client's side of exactly-once frames: writer streams, ``resume=True``, ``verify=True``,
snapshot/restore and the CLI, against real servers on loopback (in this process, or spawned)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from sapgrid.client import Client
from sapgrid.client.errors import DataLoss, FailedPrecondition, InvalidArgument
from sapgrid.layout import pairs_digest
from sapgrid.tools import cli
from sapgrid.tools.spawn import SpawnedServer, free_port
from service_helpers import random_boxes


def _moves(rng, n: int, frames: int) -> list[dict]:
    ids = np.arange(1, n + 1, dtype=np.uint64)
    out = [dict(add_ids=ids, add_boxes=random_boxes(rng, n))]
    out += [dict(update_ids=ids, update_boxes=random_boxes(rng, n)) for _ in range(frames - 1)]
    return out


def test_a_writer_stream_numbers_from_where_the_writer_stands(client, world_name, rng):
    client.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
    frames = _moves(rng, 50, 6)
    with client.stream(world_name, writer="w1") as s:
        for f in frames[:3]:
            s.send(**f)
        assert [s.recv().seq for _ in range(3)] == [1, 2, 3]
    assert client.get_world(world_name).writers == {"w1": 3}
    with client.stream(world_name, writer="w1") as s:           # a new stream goes on at 4
        d = s.step(**frames[3])
        assert (d.seq, d.frame) == (4, 4)
        again = s.send(seq=2, **frames[1])                       # a duplicate on purpose: answered, not applied
        first = s.recv()
        assert again == 2 and first.frame == 2
    assert client.get_world(world_name).frames == 4


def test_verify_checks_every_delta_against_the_mirror(client, world_name, rng):
    client.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
    with client.stream(world_name, writer="v", verify=True) as s:
        for f in _moves(rng, 200, 10):
            d = s.step(**f)
        assert s.mirror.digest == d.pairs_digest == pairs_digest(client.pairs(world_name))


def test_verify_reports_another_writer(client, world_name, rng):
    client.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
    frames = _moves(rng, 30, 3)
    with client.stream(world_name, verify=True) as s:
        s.step(**frames[0])
        client.step(world_name, 0, **frames[1])                 # a frame of somebody else
        with pytest.raises(DataLoss, match="another writer"):
            s.step(**frames[2])


def test_a_refused_frame_takes_no_seq_in_a_resuming_stream(client, world_name, rng):
    client.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
    frames = _moves(rng, 20, 5)
    bad = dict(update_ids=np.array([999], np.uint64), update_boxes=np.zeros((1, 4), np.float32))
    with client.stream(world_name, writer="r", resume=True) as s:
        s.send(**frames[0])
        s.send(**bad)                                            # refused: unknown id
        s.send(**frames[1])                                      # pipelined behind it
        s.send(**frames[2])
        assert s.recv().seq == 1
        with pytest.raises(InvalidArgument) as err:
            s.recv()
        assert err.value.field == "update_ids"
        assert [s.recv().seq for _ in range(2)] == [2, 3]        # renumbered and applied once each
    info = client.get_world(world_name)
    assert info.frames == 3 and info.writers == {"r": 3}


def test_resume_waits_out_a_frozen_world(client, world_name, rng):
    client.create_world(world_name, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
    frames = _moves(rng, 40, 8)
    client.freeze(world_name)
    assert client.get_world(world_name).frozen
    threading.Timer(0.5, client.freeze, args=(world_name, False)).start()
    with client.stream(world_name, writer="f", resume=True, resume_deadline=30) as s:
        got = [s.step(**f) for f in frames]
        assert s.reconnects >= 1
    assert [d.frame for d in got] == list(range(1, 9))
    assert client.get_world(world_name).frames == 8


def test_resume_gives_up_at_its_deadline(tmp_path, rng):
    address = f"127.0.0.1:{free_port()}"
    server = SpawnedServer("--data-dir", str(tmp_path), listen=address, metrics_port=-1)
    with Client(address, timeout=10) as c:
        c.create_world("w", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
        s = c.stream("w", writer="g", resume=True, resume_deadline=1.5)
        s.step(**_moves(rng, 10, 1)[0])
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(Exception, match="could not resume"):
            s.step(update_ids=np.array([1], np.uint64), update_boxes=np.zeros((1, 4), np.float32))
        assert time.monotonic() - t0 < 30
        s.close()


def test_lost_answered_frames_are_data_loss(rng):
    """A server without a data directory restarts empty: the client says so instead of writing on."""
    address = f"127.0.0.1:{free_port()}"
    server = SpawnedServer(listen=address, metrics_port=-1)
    try:
        with Client(address, timeout=10) as c:
            c.create_world("w", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
            s = c.stream("w", writer="lost", resume=True, resume_deadline=60)
            for f in _moves(rng, 10, 3):
                s.step(**f)
            server.proc.kill()
            server.wait(30)
            server = SpawnedServer(listen=address, metrics_port=-1)
            c.create_world("w", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
            with pytest.raises(DataLoss, match="stands at seq 0"):
                s.step(update_ids=np.array([1], np.uint64), update_boxes=np.zeros((1, 4), np.float32))
            s.close()
    finally:
        server.stop()


def test_snapshot_and_restore_through_the_cli(client, server, world_name, rng, tmp_path, capsys):
    client.create_world(world_name, dims=3, bounds=(0, 0, 0, 50, 50, 50), cells=(2, 2, 2))
    n = 300
    ids = np.arange(1, n + 1, dtype=np.uint64)
    lo = rng.uniform(0, 45, size=(n, 3))
    boxes = np.concatenate([lo, lo + rng.uniform(0.5, 4, size=(n, 3))], axis=1).astype(np.float32)
    client.step(world_name, 1, writer="cli", add_ids=ids, add_boxes=boxes,
                add_category=rng.integers(1, 4, n).astype(np.uint32), add_mask=rng.integers(1, 4, n).astype(np.uint32),
                add_static=rng.random(n) < 0.3)
    path = tmp_path / "w.snap"
    assert cli.main(["worlds", "snapshot", world_name, str(path), "--server", server.address]) == 0
    assert path.stat().st_size > n * 24
    copy = world_name[:50] + "-copy"
    assert cli.main(["worlds", "restore", str(path), "--name", copy, "--server", server.address]) == 0
    assert f"restored {copy}" in capsys.readouterr().out
    a, b = client.get_world(world_name), client.get_world(copy)
    assert (b.objects, b.pairs, b.frames, b.writers, b.pairs_digest) == (a.objects, a.pairs, a.frames, a.writers,
                                                                          a.pairs_digest)
    moved = dict(update_ids=ids[:100], update_boxes=boxes[100:200])
    da = client.step(world_name, 2, writer="cli", **moved)
    db = client.step(copy, 2, writer="cli", **moved)                 # the copy goes on exactly like the original
    assert np.array_equal(da.created, db.created) and np.array_equal(da.deleted, db.deleted)
    assert da.pairs_digest == db.pairs_digest
    with pytest.raises(FailedPrecondition):
        client.step(copy, 5, writer="cli", **moved)                   # the writer's seq went along: 5 is a gap
    assert cli.main(["worlds", "restore", str(path), "--name", copy, "--server", server.address]) == 1
    assert "ALREADY_EXISTS" in capsys.readouterr().err
    path.write_bytes(path.read_bytes()[:-7])
    assert cli.main(["worlds", "restore", str(path), "--name", copy + "x", "--server", server.address]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def test_a_resuming_stream_of_an_unknown_world_fails_at_once(client):
    from sapgrid.client.errors import NotFound

    t0 = time.monotonic()
    with pytest.raises(NotFound):
        client.stream("no-such-world-here", writer="x", resume=True, resume_deadline=60)
    assert time.monotonic() - t0 < 30                 # not the resume deadline
