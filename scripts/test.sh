#!/usr/bin/env bash
# Install from scratch (if needed) and run every check CI runs: generated code in sync, lint, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/python scripts/gen_proto.py --check
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
