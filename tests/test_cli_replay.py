"""``sapgrid replay`` of a file that is not a trace (empty, text, a .npz without the kit's arrays): one line
naming the file, exit code 2, no traceback."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest


@pytest.mark.parametrize("content", [b"", b"hello\n", "npz"])
def test_a_file_that_is_not_a_trace(tmp_path, content):
    path = tmp_path / "t.npz"
    if content == "npz":
        np.savez(path, a=np.zeros(3))
    else:
        path.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "sapgrid.tools.cli", "replay", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "not a trace" in lines[0], proc.stderr
