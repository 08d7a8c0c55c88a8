"""A world cannot be deleted while the server recovers its data directory: the recovery registers the world
before it replays its log, and a delete in between used to drop it from the server while its files stayed,
so the deleted world came back at the next start (seen with ``sapgrid demo``, whose resume gave up while
a slow recovery went on, then deleted its world)."""
from __future__ import annotations

import os
import threading

import grpc
import pytest

from sapgrid.client import Client
from sapgrid.client.errors import Unavailable
from sapgrid.server import storage as storage_mod
from sapgrid.server.app import build_server
from sapgrid.server.config import from_args


def _app(data_dir):
    return build_server(from_args(env={}, listen="127.0.0.1:0", metrics_port=-1, data_dir=str(data_dir),
                                  default_world=""))


def test_delete_during_recovery_is_refused_and_the_world_stays(tmp_path, monkeypatch):
    data = tmp_path / "data"
    app = _app(data)
    app.start()
    try:
        with Client(app.address, timeout=60) as c:
            c.create_world("kept", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
            with c.stream("kept", writer="m1") as s:
                s.step(add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
    finally:
        app.stop(2.0)

    gate, replaying = threading.Event(), threading.Event()
    real = storage_mod.Storage._replay

    def slow_replay(self, runner, *args, **kwargs):      # the world is registered; its log is not replayed yet
        replaying.set()
        assert gate.wait(60)
        return real(self, runner, *args, **kwargs)

    monkeypatch.setattr(storage_mod.Storage, "_replay", slow_replay)
    app = _app(data)
    t = threading.Thread(target=app.start)
    t.start()
    try:
        assert replaying.wait(60)
        with Client(app.address, timeout=60) as c:
            with pytest.raises(Unavailable, match="recovering"):
                c.delete_world("kept")
            with pytest.raises(Unavailable, match="recovering"):   # not a list without the worlds still to come
                c.list_worlds()
        gate.set()
        t.join(60)
        assert not t.is_alive()
        with Client(app.address, timeout=60) as c:
            info = c.get_world("kept")
            assert (info.objects, info.pairs, info.writers) == (2, 1, {"m1": 1})
            c.delete_world("kept")                            # after recovery: deleted with its files
    finally:
        gate.set()
        t.join(60)
        app.stop(2.0)
    assert os.listdir(data / "worlds") == []
    monkeypatch.setattr(storage_mod.Storage, "_replay", real)
    app = _app(data)
    app.start()
    try:
        with Client(app.address, timeout=60) as c:
            assert [w.name for w in c.list_worlds()] == []
    finally:
        app.stop(2.0)


def test_a_world_whose_log_cannot_be_replayed_is_still_undone_by_the_recovery(tmp_path, monkeypatch):
    """The recovery's own delete (a world it could not finish) still works while it recovers."""
    data = tmp_path / "data"
    app = _app(data)
    app.start()
    try:
        with Client(app.address, timeout=60) as c:
            c.create_world("broken", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
            with c.stream("broken") as s:
                s.step(add_ids=[1], add_boxes=[[0, 0, 2, 2]])
    finally:
        app.stop(2.0)

    def failing_replay(self, runner, *args, **kwargs):
        raise storage_mod.RecoveryError("a damaged record (test)")

    monkeypatch.setattr(storage_mod.Storage, "_replay", failing_replay)
    app = _app(data)
    app.start()
    try:
        assert app.recovered.failed.keys() == {"broken"}
        with grpc.insecure_channel(app.address) as ch:
            grpc.channel_ready_future(ch).result(timeout=60)
        with Client(app.address, timeout=60) as c:
            assert [w.name for w in c.list_worlds()] == []
    finally:
        app.stop(2.0)
    assert os.listdir(data / "worlds") == ["w-broken"]                 # its files are left as found
