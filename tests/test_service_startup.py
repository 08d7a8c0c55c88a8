"""``sapgrid serve`` refuses a bad configuration or a busy port with one line naming it, exit code 2,
no traceback and nothing half-started (no world created, no port left bound)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def _serve(*flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sapgrid.server", *flags], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture
def busy_port():
    """A loopback port held by a listening socket of this test."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


def _one_line_refusal(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for w in words:
        assert w in lines[0], lines[0]
    assert "created" not in proc.stdout + proc.stderr and "listening" not in proc.stdout


def test_busy_grpc_port(busy_port):
    _one_line_refusal(_serve("--listen", f"127.0.0.1:{busy_port}", "--metrics-port", "-1"), "--listen",
                      str(busy_port))


def test_busy_metrics_port(busy_port):
    proc = _serve("--listen", "127.0.0.1:0", "--metrics-port", str(busy_port))
    _one_line_refusal(proc, "--metrics-port", str(busy_port))


@pytest.mark.parametrize("flags, env, words", [
    (["--default-world-bounds", "0,0,10"], {}, ["--default-world", "bounds"]),
    (["--default-world-cells", "0,4"], {}, ["--default-world", "cells"]),
    ([], {"SAPGRID_QUEUE_SIZE": "abc"}, ["SAPGRID_QUEUE_SIZE", "not an integer"]),
    ([], {"SAPGRID_QUEUE_SIZE": "0"}, ["SAPGRID_QUEUE_SIZE", ">= 1"]),
    (["--queue-size", "x"], {}, ["--queue-size", "not an integer"]),
    (["--listen", "nowhere"], {}, ["--listen", "HOST:PORT"]),
    (["--metrics-port", "70000"], {}, ["--metrics-port"]),
])
def test_bad_configuration(flags, env, words):
    _one_line_refusal(_serve("--listen", "127.0.0.1:0", *flags, env=env), *words)


def test_version():
    from sapgrid import __version__

    proc = subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"sapgrid {__version__}"
