#!/usr/bin/env bash
# README command two: set up and run the whole test suite (lint, types, unit and integration tests on a real
# local Slurm cluster). Under CI=true a missing Slurm fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
export WITH_ACCOUNTING="${WITH_ACCOUNTING:-1}"  # slurmdbd + MariaDB for the sacct tests
bash scripts/setup.sh
# The CPU build of PyTorch, for the torchrun (2-node gloo all-reduce) and torch.distributed tests;
# without it those few tests skip and say so.
if [ "${WITH_TORCH:-1}" = 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if ! .venv/bin/python -m pip install -q torch==2.13.0 >.venv/torch-install.log 2>&1; then
    echo "test: torch 2.13.0 not installable here (.venv/torch-install.log): the torch tests will skip"
  fi
fi
echo "== lint"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
echo "== types"
.venv/bin/mypy
echo "== tests"
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
