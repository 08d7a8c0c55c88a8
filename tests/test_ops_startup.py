"""`sapgrid serve` with a bad flag or environment variable: one line naming it, exit code 2."""
import os
import subprocess
import sys

import pytest


def _serve(*flags, env=None):
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "serve", "--listen", "127.0.0.1:0",
                           "--metrics-port", "-1", *flags], capture_output=True, text=True, timeout=60, env=full)


@pytest.mark.parametrize("flags, env, named", [
    ((), {"SAPGRID_QUEUE_SIZE": "abc"}, "SAPGRID_QUEUE_SIZE='abc'"),
    (("--worker-threads", "many"), None, "--worker-threads='many'"),
    (("--default-world-bounds", "0,0,x,10"), None, "--default-world-bounds='0,0,x,10'"),
])
def test_bad_value_names_its_flag_or_variable(flags, env, named):
    out = _serve(*flags, env=env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_bad_default_world_and_busy_port_are_one_line():
    import socket

    out = _serve("--default-world-cells", "8")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "cells" in out.stderr and "Traceback" not in out.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        full = dict(os.environ)
        out = subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "serve", "--listen", f"127.0.0.1:{port}",
                              "--metrics-port", "-1"], capture_output=True, text=True, timeout=60, env=full)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and str(port) in out.stderr.strip().splitlines()[-1], out.stderr


def test_busy_metrics_port_is_one_line_and_nothing_left_serving():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "serve", "--listen", "127.0.0.1:0",
                              "--metrics-port", str(port)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and f"--metrics-port {port}" in out.stderr, out.stderr
    assert "listening on" not in out.stdout
