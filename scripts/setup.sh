#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install sapgrid with its test extras. Idempotent.
# On a fresh Debian 12: installs python3-venv with apt first if the venv module is missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "setup: $PY not found; install Python 3.11+ (Debian 12: apt-get install python3)" >&2
  exit 1
fi
"$PY" - <<'PYEOF' || { echo "setup: Python 3.11+ is required" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYEOF

venv_ok() { "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; }
if [ ! -x .venv/bin/python ]; then
  if ! venv_ok; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing python3-venv (apt)"
      ver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq python3-venv || apt-get install -y -qq "python${ver}-venv"
    else
      echo "setup: the Python venv module is missing; install it (Debian: sudo apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi

# numba's OpenMP threading layer (the one the engine is tuned with: workers wait passively) needs
# libgomp (absent on minimal Debian); without it numba falls back to its workqueue layer, which works
# too. Best effort: only as root with apt, never fatal.
if ! ldconfig -p 2>/dev/null | grep -q 'libgomp\.so\.1'; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing libgomp1 (apt) for numba's OpenMP threading layer"
    (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq libgomp1) \
      || echo "setup: could not install libgomp1; continuing with numba's workqueue threading layer"
  fi
fi

stamp=.venv/.sapgrid-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing sapgrid and test dependencies into .venv (pip)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  touch "$stamp"
fi
# What the tests need beyond Python packages (proxy, Node.js packages, C++ toolchain, browser, promtool):
# one idempotent script per component in scripts/setup.d, run in name order.
for step in scripts/setup.d/*.sh; do
  [ -e "$step" ] || continue
  bash "$step"
done
echo "setup: ok ($(.venv/bin/python --version))"
