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


def test_cache_directories_of_other_versions_go_once_stale(tmp_path):
    """Every start touches its own cache directory; another version's, untouched for STALE_CACHE_DAYS, is
    removed; a recent one (another install in use) and anything not ``sapcore-*`` stay."""
    from sapcore import _numba

    now = 1_000_000_000.0
    day = 86400
    mine, recent, stale, other = (tmp_path / n for n in ("sapcore-aaaa", "sapcore-bbbb", "sapcore-cccc", "keep"))
    for d in (mine, recent, stale, other):
        d.mkdir()
        (d / "k.nbi").write_bytes(b"x")
    old = now - (_numba.STALE_CACHE_DAYS + 1) * day
    os.utime(mine, (old, old))                        # this version's, itself old: touched, never removed
    os.utime(recent, (now - day, now - day))
    os.utime(stale, (old, old))
    os.utime(other, (old, old))
    removed = _numba.prune_stale_caches(str(mine), now=now)
    assert removed == [str(stale)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep", "sapcore-aaaa", "sapcore-bbbb"]
    assert os.stat(mine).st_mtime == now
    assert _numba.prune_stale_caches(str(tmp_path / "missing" / "sapcore-dddd"), now=now) == []
