#!/usr/bin/env bash
# README command two: set up and run the whole test suite (lint, unit and integration tests on a real
# local Slurm cluster). Under CI=true a missing Slurm fails the run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
export WITH_ACCOUNTING="${WITH_ACCOUNTING:-1}"  # slurmdbd + MariaDB for the sacct tests
bash scripts/setup.sh
echo "== lint"
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
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
