"""The container files pass hadolint (pins justified inline) and the compose files a real compose
parser (Debian's docker-compose, `config` needs no daemon). Both installed by the project's setup."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def _tool(name: str, path: str | None = None) -> str:
    found = path if path and Path(path).exists() else shutil.which(name)
    if not found:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed (scripts/setup.sh installs it)")
        pytest.skip(f"{name} is not installed (run scripts/setup.sh)")
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "proxy/Dockerfile"])
def test_hadolint_is_clean(dockerfile):
    hadolint = _tool("hadolint", str(Path(sys.executable).parent / "hadolint"))
    proc = subprocess.run([hadolint, "--no-color", str(DEPLOY / dockerfile)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("compose", ["compose.yaml", "compose.cluster.yaml"])
def test_compose_file_parses_with_a_real_compose(compose, tmp_path):
    tool = _tool("docker-compose")
    proc = subprocess.run([tool, "-f", str(DEPLOY / compose), "config"], capture_output=True, text=True,
                          timeout=120, cwd=DEPLOY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "services:" in proc.stdout
