#!/usr/bin/env bash
# promtool (Debian's prometheus package ships it): the alert rules' check and unit tests; Debian's
# docker-compose: a real compose parser for the compose files (`docker-compose config`, no daemon).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/apt.sh
apt_install prometheus docker-compose
