#!/usr/bin/env bash
# Set up .venv if needed, start a sapgrid server on a free loopback port with its default world, and run
# the live demo client against it (moving boxes, ticks/s, pairs, latency). Ctrl-C stops both.
# Extra arguments go to `sapgrid demo`, e.g. ./scripts/demo.sh --objects 20000 --ticks 500
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# the kernels the server loads as it starts, into numba's cache first: with an empty cache the server would
# compile them while the demo's first frames wait
echo "demo: the engine's kernels into numba's cache (a second or two; the first run compiles them, ~8 min on 2 cores)"
.venv/bin/python deploy/warm_cache.py
exec .venv/bin/sapgrid demo --spawn-server "$@"
