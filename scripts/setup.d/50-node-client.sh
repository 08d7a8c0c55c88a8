#!/usr/bin/env bash
# The Node.js client (client/node): Debian's nodejs and npm (unless a node with npm is installed
# already), its npm dependencies from the lockfile (npm ci), and its build (protos copied in, types
# generated, TypeScript compiled to dist/). Idempotent: npm ci only when the lockfile changed, the
# build only when an input is newer than dist/index.js.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/apt.sh
command -v npm >/dev/null 2>&1 || apt_install nodejs npm
cd client/node
stamp=node_modules/.sapgrid-npm-ci
if [ ! -f "$stamp" ] || [ package-lock.json -nt "$stamp" ] || [ package.json -nt "$stamp" ]; then
  echo "setup: npm ci in client/node"
  npm ci --no-audit --no-fund --loglevel=error
  touch "$stamp"
fi
if [ ! -f dist/index.js ] || [ -n "$(find src scripts examples tsconfig.json package-lock.json ../../proto/sapgrid/v1 \
    -newer dist/index.js \( -name '*.ts' -o -name '*.mjs' -o -name '*.json' -o -name '*.proto' \) -print -quit)" ]; then
  echo "setup: building client/node"
  npm run build --silent
fi
