#!/usr/bin/env bash
# Set up .venv if needed, then run every test. Exit status non-zero on any failure.
# Extra arguments go to the main pytest run only, e.g. ./scripts/test.sh -k service -x
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ $# -eq 0 ]; then
  # The engine's kernels as plain Python (NUMBA_DISABLE_JIT=1): the property tests against the oracle on
  # a small budget, so what the kernels mean in Python is checked too, not only their compiled form.
  # (uint64 arithmetic that wraps on purpose warns in plain Python.)
  echo "test: core property tests with NUMBA_DISABLE_JIT=1"
  NUMBA_DISABLE_JIT=1 SAPGRID_CORE_EXAMPLES=40 .venv/bin/python -m pytest tests/test_core_properties.py -q \
    -p no:cacheprovider -W "ignore:overflow encountered in scalar multiply:RuntimeWarning"
fi
exec .venv/bin/python -m pytest tests/ "$@"
