#!/usr/bin/env bash
# Headless Chromium for the viewer's browser test (Debian's chromium, driven by playwright-core
# from npm: no browser download) and node/npm to run the driver script.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/apt.sh
apt_install chromium
# node and npm: Debian's, unless a node with npm is installed already
command -v npm >/dev/null 2>&1 || apt_install nodejs npm
if [ -f tests/browser/package-lock.json ]; then
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
fi
