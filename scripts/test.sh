#!/usr/bin/env bash
# Install from scratch (if needed) and run every check CI runs: generated code in sync, lint, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh
.venv/bin/python scripts/gen_proto.py --check
.venv/bin/ruff check .
# Test files spread over VFLSEC_TEST_WORKERS processes (default 2: CI's cores), each file whole in one of them so
# that its module fixtures are made once; -n 0 (or VFLSEC_TEST_WORKERS=0) runs them in this process.
.venv/bin/python -m pytest -q -n "${VFLSEC_TEST_WORKERS:-2}" --dist loadfile "$@"
