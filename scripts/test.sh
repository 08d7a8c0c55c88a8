#!/usr/bin/env bash
# Set up .venv if needed, then run every test (pytest tests/). Exit status = pytest's (non-zero on failure).
# Extra arguments go to pytest, e.g. ./scripts/test.sh -k service -x
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest tests/ "$@"
