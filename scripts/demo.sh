#!/usr/bin/env bash
# Install (if needed) and run the demo: coordinator, active and passive parties as separate processes on
# loopback with fresh certificates; PSI, HE training, prediction. Extra arguments go to `vflsec demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
exec .venv/bin/vflsec demo "$@"
