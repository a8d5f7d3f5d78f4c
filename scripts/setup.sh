#!/usr/bin/env bash
# Set up everything on a fresh Debian/Ubuntu machine (as root): Slurm and munge from the distribution's
# packages, a virtual environment in .venv with slurm-preempt and its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-slurm.sh
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup: installing python3-venv"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/slurm-preempt --version
