"""sapcore's kernel cache: one directory per version of its sources, so that no kernel runs stale code
inlined from a file that changed (numba keys a cached kernel by its own file only)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import sapcore

_PRINT = "import numba, sapcore._numba as n; print(n.sources_digest(), numba.config.CACHE_DIR)"


def _digest_and_dir(root, env: dict) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", _PRINT], cwd=root, env={**os.environ, "PYTHONPATH": str(root), **env},
                         capture_output=True, text=True, timeout=300, check=True).stdout.split()
    return out[0], out[1]


def test_the_cache_directory_follows_every_source_file(tmp_path):
    src = os.path.dirname(sapcore.__file__)
    copy = tmp_path / "pkg"
    shutil.copytree(src, copy / "sapcore", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    digest, where = _digest_and_dir(copy, env)
    assert where == str(tmp_path / "cache" / f"sapcore-{digest}")
    assert _digest_and_dir(copy, env)[0] == digest                    # stable
    helper = copy / "sapcore" / "kernels" / "sap_cell.py"             # a file whose helpers others inline
    helper.write_text(helper.read_text() + "\n# changed\n")
    changed, where2 = _digest_and_dir(copy, env)
    assert changed != digest and where2 == str(tmp_path / "cache" / f"sapcore-{changed}")
    home = {"NUMBA_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert _digest_and_dir(copy, home)[1] == str(tmp_path / "xdg" / "sapgrid" / "numba" / f"sapcore-{changed}")
