#!/usr/bin/env bash
# Set up .venv if needed, start a sapgrid server on a free loopback port with its default world, and run
# the live demo client against it (moving boxes, ticks/s, pairs, latency). Ctrl-C stops both.
# Extra arguments go to `sapgrid demo`, e.g. ./scripts/demo.sh --objects 20000 --ticks 500
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/sapgrid demo --spawn-server "$@"
