"""``sapgrid bench --server``: a server that cannot be reached, or one without the bench-only EchoService,
is one line (with what to do), exit code 1, no traceback, and no world left behind."""
from __future__ import annotations

import socket

from sapgrid.client import Client
from sapgrid.tools import cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line(capsys, code: int, *words: str) -> None:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]


def test_an_unreachable_server(capsys):
    address = f"127.0.0.1:{_free_port()}"
    _one_line(capsys, cli.main(["bench", "--server", address, "--rtt-objects", "100"]), "UNAVAILABLE")
    _one_line(capsys, cli.main(["bench", "--server", address, "--worlds", "2", "--seconds", "1",
                                "--heavy-objects", "0"]), "UNAVAILABLE")


def test_a_server_without_the_echo_service(server, capsys):
    code = cli.main(["bench", "--server", server.address, "--rtt-objects", "100", "--fps-objects", "100",
                     "--fps-ticks", "5"])
    _one_line(capsys, code, "UNIMPLEMENTED", "sapgrid serve --echo")
    with Client(server.address, timeout=60) as c:
        assert not [w.name for w in c.list_worlds() if w.name.startswith("bench-")]
