"""``sapgrid bench --server``: a server that cannot be reached, or one without the bench-only EchoService,
is one line (with what to do), exit code 1, no traceback, and no world left behind."""
from __future__ import annotations

import os

from sapgrid.client import Client
from sapgrid.tools import cli
from sapgrid.tools.spawn import free_port


def _one_line(capsys, code: int, *words: str) -> None:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]


def test_an_unreachable_server(capsys):
    address = f"127.0.0.1:{free_port()}"
    _one_line(capsys, cli.main(["bench", "--server", address, "--rtt-objects", "100"]), "UNAVAILABLE")
    _one_line(capsys, cli.main(["bench", "--server", address, "--worlds", "2", "--seconds", "1",
                                "--heavy-objects", "0"]), "UNAVAILABLE")


def test_a_server_without_the_echo_service(server, capsys):
    code = cli.main(["bench", "--server", server.address, "--rtt-objects", "100", "--fps-objects", "100",
                     "--fps-ticks", "5"])
    _one_line(capsys, code, "UNIMPLEMENTED", "sapgrid serve --echo")
    with Client(server.address, timeout=60) as c:
        assert not [w.name for w in c.list_worlds() if w.name.startswith("bench-")]


def test_many_worlds_over_tls_with_a_token(make_server, tmp_path, capsys):
    """The many-worlds mode's streams use the command's credentials (they were always plaintext)."""
    from sapgrid.client._channel import set_defaults

    from security_helpers import auth_file, make_certs

    certs = make_certs(tmp_path / "pki")
    crt, key = certs.server()
    tokens = auth_file(tmp_path / "auth.toml", {"ops": ("admin", "*")})
    common = dict(tls_cert=crt, tls_key=key, auth_file=str(tmp_path / "auth.toml"), metrics_port=-1)
    argv = ["--worlds", "2", "--objects", "100", "--hz", "10", "--seconds", "1", "--heavy-objects", "0",
            "--tls-ca", certs.ca_file, "--token", tokens["ops"]]
    try:
        with_echo = make_server(echo=True, **common)
        assert cli.main(["bench", "--server", with_echo.address, *argv]) == 0, capsys.readouterr().err
        assert "| frames delivered / asked | " in capsys.readouterr().out
        without = make_server(**common)
        _one_line(capsys, cli.main(["bench", "--server", without.address, *argv]), "UNIMPLEMENTED",
                  "sapgrid serve --echo")
        with Client(without.address, timeout=60, ca_file=certs.ca_file, token=tokens["ops"]) as c:
            assert not [w.name for w in c.list_worlds() if w.name != "default"]
    finally:
        set_defaults()


def test_bad_sizes_name_the_flag(capsys):
    assert cli.main(["bench", "--sizes", "1000,abc", "--ticks", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sizes '1000,abc'" in err, err


def test_the_durability_round_trips_take_the_servers_in_turn_on_the_same_frames(make_server, tmp_path):
    """``--data-dir-compare``'s round trips: every server gets its ticks in blocks, in turn; the worlds (and
    the durable one's files) go afterwards."""
    from sapgrid.tools import bench_durable as bd

    servers = dict(memory=make_server(metrics_port=-1), everysec=make_server(metrics_port=-1,
                                                                             data_dir=str(tmp_path / "d")))
    clients = {m: Client(s.address, timeout=120) for m, s in servers.items()}
    try:
        out = bd.rtt_in_turn(clients, 200, 3, seed=5)
        for m, r in out.items():
            assert len(r["ticks"]) == 3 * bd.RTT_BLOCK and len(r["blocks"]) == 3, m
            assert all(t > 0 for t in r["ticks"])
        for c in clients.values():
            assert not [w.name for w in c.list_worlds() if w.name.startswith("bench-")]
        registry = servers["everysec"].app.registry
        assert registry.storage is not None and os.listdir(registry.storage.worlds_dir) == ["w-default"]
    finally:
        for c in clients.values():
            c.close()


def test_the_durability_bench_measures_servers_that_loaded_their_kernels_and_reads_their_output(tmp_path):
    """``--data-dir-compare``'s servers (``bench_durable._spawn``): returned once the engine's kernels are
    loaded, their output read to the end meanwhile (300 worlds made and deleted log ~180 KB; a pipe left
    unread fills at 64 KiB and stalls the server's calls)."""
    from sapgrid.tools import bench_durable as bd
    from sapgrid.tools.spawn import KERNELS_LOADED

    server, listening_s = bd._spawn("--data-dir", str(tmp_path / "d"))
    try:
        assert listening_s > 0 and any(line.startswith(KERNELS_LOADED) for line in server.lines), server.lines
        with Client(server.address, timeout=30) as c:
            for k in range(300):
                c.create_world(f"w{k}", dims=2)
                c.delete_world(f"w{k}")
    finally:
        server.stop(bd.STOP_TIMEOUT_S)
    assert sum("world 'w299' deleted" in line for line in server.lines) == 1
