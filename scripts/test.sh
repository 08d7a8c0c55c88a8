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
# The engine's kernels into numba's on-disk cache once, before the tests (the image's build step, what a
# server loads as it starts): a second or two when cached; after a change of sapcore's sources they are
# compiled here, ~8 minutes on 2 cores, instead of by every server process the tests start at once.
echo "test: the engine's kernels into numba's cache (deploy/warm_cache.py)"
.venv/bin/python deploy/warm_cache.py
exec .venv/bin/python -m pytest tests/ "$@"
