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
