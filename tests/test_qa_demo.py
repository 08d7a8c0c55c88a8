"""``sapgrid demo``: its untimed warm-up tick moves every box, so the first timed tick does not pay for
loading the kernels of a moving frame; the demo's world is deleted at the end."""
from __future__ import annotations

import numpy as np

from sapgrid.tools import cli


def test_the_warm_up_tick_moves_every_box(make_server, capsys):
    from sapcore import World

    steps = []

    class Recording(World):
        def step(self, *args, **kwargs):
            steps.append({k: None if v is None else np.array(v, copy=True) for k, v in kwargs.items()})
            return super().step(*args, **kwargs)

    srv = make_server(world_factory=Recording, metrics_port=-1)
    steps.clear()                                     # the default world's creation, if it stepped
    assert cli.main(["demo", "--server", srv.address, "--ticks", "2", "--objects", "200", "--world", "qa-demo"]) == 0
    first, warm_up, timed = [s for s in steps if s.get("add_ids") is not None or s.get("update_ids") is not None][:3]
    assert len(first["add_ids"]) == 200
    moved = np.any(warm_up["update_boxes"] != first["add_boxes"], axis=1)
    assert len(warm_up["update_ids"]) == 200 and moved.mean() > 0.9      # boxes with |v| > 0 moved
    assert np.any(timed["update_boxes"] != warm_up["update_boxes"])
    assert "done: 2 ticks" in capsys.readouterr().out


def test_the_start_hint_only_when_no_server_answers(make_server, capsys):
    """Not reachable: how to start one (or give the CA of a TLS server); up but refusing: its own reason only."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["demo", "--server", f"127.0.0.1:{port}", "--ticks", "1", "--connect-timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "not reachable" in err and "sapgrid serve" in err and "--tls-ca" in err
    srv = make_server(max_worlds=1, default_world="", metrics_port=-1)
    from sapgrid.client import Client

    with Client(srv.address, timeout=60) as c:
        c.create_world("qa-full", dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
    assert cli.main(["demo", "--server", srv.address, "--ticks", "1"]) == 1      # RESOURCE_EXHAUSTED: too many
    err = capsys.readouterr().err
    assert "RESOURCE_EXHAUSTED" in err and "sapgrid serve" not in err and err.count("\n") == 1


def test_no_start_hint_while_the_server_recovers(tmp_path, monkeypatch, capsys):
    import threading

    from sapgrid.client import Client
    from sapgrid.server import storage as storage_mod
    from sapgrid.server.app import build_server
    from sapgrid.server.config import from_args

    def app():
        return build_server(from_args(env={}, listen="127.0.0.1:0", metrics_port=-1, data_dir=str(tmp_path / "d"),
                                      default_world=""))

    first = app()
    first.start()
    try:
        with Client(first.address, timeout=60) as c:
            c.create_world("kept", dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
    finally:
        first.stop(2.0)
    gate, replaying = threading.Event(), threading.Event()
    real = storage_mod.Storage._replay

    def slow(self, *args, **kwargs):
        replaying.set()
        assert gate.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(storage_mod.Storage, "_replay", slow)
    second = app()
    t = threading.Thread(target=second.start)
    t.start()
    try:
        assert replaying.wait(60)
        assert cli.main(["demo", "--server", second.address, "--ticks", "1"]) == 1
        err = capsys.readouterr().err
        assert "recovering" in err and "sapgrid serve" not in err and err.count("\n") == 1
    finally:
        gate.set()
        t.join(60)
        second.stop(2.0)
