"""``sapgrid view --listen``: a busy or malformed address is one line naming --listen, exit code 2, no
traceback; the page's address is printed only once it is served."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest



def _view(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "view", "--server", "127.0.0.1:1", *argv],
                          capture_output=True, text=True, timeout=timeout)


def _one_line(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "http://" not in proc.stdout
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_a_busy_listen_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        _one_line(_view("--listen", f"127.0.0.1:{port}"), "--listen", str(port), "cannot listen there")


@pytest.mark.parametrize("listen", ["nowhere", "127.0.0.1:http", "127.0.0.1:70000"])
def test_a_malformed_listen_address(listen):
    _one_line(_view("--listen", listen), "--listen", "HOST:PORT")


def test_the_world_list_says_when_the_server_is_unreachable():
    """/api/worlds with the server down (or restarting): 503 with the reason, not a 500 and a traceback."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from sapgrid.tools.viewer import app as viewer_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"           # nothing listens there once closed

    async def run():
        client = TestClient(TestServer(viewer_app.make_app(address, "")))
        await client.start_server()
        try:
            resp = await client.get("/api/worlds")
            body = await resp.json()
            assert resp.status == 503 and body["worlds"] == [] and "UNAVAILABLE" in body["error"]
        finally:
            await client.close()

    asyncio.run(run())
