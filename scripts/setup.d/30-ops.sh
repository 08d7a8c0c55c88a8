#!/usr/bin/env bash
# promtool (Debian's prometheus package ships it): the alert rules' check and unit tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/apt.sh
apt_install prometheus
