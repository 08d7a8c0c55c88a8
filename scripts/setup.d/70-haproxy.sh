#!/usr/bin/env bash
# HAProxy from Debian: the cluster's router (gRPC over HTTP/2, world-name routing), used by the cluster
# tests, the compose stack and the Kubernetes proxy Deployment.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/apt.sh
apt_install haproxy
# The package enables a system service; the project starts its own instances only.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now haproxy >/dev/null 2>&1 || true
fi
