#!/usr/bin/env bash
# Create .venv and install vflsec with its test tools, once: again only when pyproject.toml changes (its hash is
# kept in .venv/.vflsec-installed) or with --force. torch goes first and pinned: the CPU build of torch 2.13.0 is
# what the project is tested with (any other spec may pull GBs of CUDA). Python 3.11 by default; 3.12 and 3.13
# work too (PYTHON=python3.13 ./scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
stamp=.venv/.vflsec-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "${1:-}" != "--force" ] && [ -x .venv/bin/vflsec ] && [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ]; then
  exit 0  # installed (editable: code changes need no reinstall) from this pyproject.toml
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev,ray]"  # ray: the `experiment --ray` test (~30 s to install)
echo "$wanted" > "$stamp"
