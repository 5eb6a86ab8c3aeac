#!/usr/bin/env bash
# Create .venv and install vflsec with its test tools, once: again only when pyproject.toml changes (its hash is
# kept in .venv/.vflsec-installed) or with --force. torch goes first and pinned: the CPU build of torch 2.13.0 is
# what the project is tested with (any other spec may pull GBs of CUDA). Python 3.11 by default; 3.12 and 3.13
# work too (PYTHON=python3.13 ./scripts/install.sh, into a new .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
# Ask the interpreter itself: a pyenv shim answers `command -v python3.12` for a version that is installed but not
# active, then fails when run.
supported() { "$1" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' >/dev/null 2>&1; }
asked=${PYTHON:-}
if [ -z "$asked" ]; then
  PYTHON=python3.11
  supported "$PYTHON" || PYTHON=python3
fi
if ! supported "$PYTHON"; then
  echo "install.sh: PYTHON=$PYTHON is not a runnable Python 3.11, 3.12 or 3.13 (with pyenv, give its path:" \
    "PYTHON=\$(pyenv prefix 3.12.1)/bin/python3.12)" >&2
  exit 2
fi
version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
if [ -n "$asked" ] && [ -x .venv/bin/python ] && [ "$(version .venv/bin/python)" != "$(version "$PYTHON")" ]; then
  echo "install.sh: .venv has Python $(version .venv/bin/python), $PYTHON is $(version "$PYTHON"): remove .venv" \
    "(rm -r .venv) to install with $(version "$PYTHON")" >&2
  exit 2
fi
# PSI runs on the system's libsodium (>= 1.0.18, for ristretto255) through pysodium; Debian's package is libsodium23.
# (pysodium finds it the way this asks.)
if ! "$PYTHON" -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("sodium") is None)'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq libsodium23 >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq libsodium23; }
  else
    echo "install.sh: PSI needs libsodium >= 1.0.18 (Debian/Ubuntu: apt-get install libsodium23;" \
      "macOS: brew install libsodium)" >&2
    exit 2
  fi
fi
stamp=.venv/.vflsec-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "${1:-}" != "--force" ] && [ -x .venv/bin/vflsec ] && [ "$(cat "$stamp" 2>/dev/null)" = "$wanted" ]; then
  exit 0  # installed (editable: code changes need no reinstall) from this pyproject.toml
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch's CPU build: from the machine's wheels when they hold it (CI's Python 3.11), else from PyTorch's CPU index (PyPI's
# Linux torch is a CUDA build of several GB; 2.13.0+cpu sorts above it, so pip takes the CPU one).
if ! .venv/bin/python -m pip install --quiet --no-deps --no-index "torch==2.13.0" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
fi
.venv/bin/python -m pip install --quiet "torch==2.13.0"  # its dependencies
.venv/bin/python -m pip install --quiet -e ".[dev,ray]"  # ray: the `experiment --ray` test (~30 s to install)
echo "$wanted" > "$stamp"
