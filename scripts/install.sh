#!/usr/bin/env bash
# Create .venv (Python 3.11) and install vflsec with its test tools. torch goes first and pinned: the
# CPU build of torch 2.13.0 is what the project is tested with (any other spec may pull GBs of CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev,ray]"  # ray: the `experiment --ray` test (~30 s to install)
