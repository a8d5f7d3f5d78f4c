#!/usr/bin/env bash
# README command two: set up and run the whole test suite (lint, types, unit and integration tests on a
# real local Slurm cluster), then the cluster tests again on each other Slurm release CI proves.
# Under CI=true a missing Slurm fails the run instead of skipping.
#   SP_TEST_RELEASES="24.11 26.05"  the other releases (each from a Debian root built once, ~40 s, into
#                                   /var/cache/slurm-preempt/roots); "" runs the host's Slurm only
set -euo pipefail
cd "$(dirname "$0")/.."
export WITH_ACCOUNTING="${WITH_ACCOUNTING:-1}"  # slurmdbd + MariaDB for the sacct tests
releases="${SP_TEST_RELEASES-24.11 26.05}"
[ -n "$releases" ] && export WITH_SLURM_ROOTS=1  # debootstrap
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
run_pytest() {
  set +e
  .venv/bin/python -m pytest "$@"
  local status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    echo "test: pytest collected no tests: that is a failure" >&2
    status=1
  fi
  return "$status"
}
failed=""
echo "== tests (the host's Slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null))"
SECONDS=0
run_pytest "$@" || failed+=" system"
echo "test: host's Slurm: ${SECONDS} s"
if [ -n "$releases" ]; then
  echo "== Slurm roots for: $releases"
  SECONDS=0
  # shellcheck disable=SC2046
  .venv/bin/slurm-preempt testcluster roots $(printf -- '--build %s ' $releases)
  echo "test: roots ready in ${SECONDS} s"
fi
for release in $releases; do
  echo "== cluster tests on Slurm $release"
  SECONDS=0
  run_pytest -m cluster --slurm "$release" "$@" || failed+=" $release"
  echo "test: Slurm $release: ${SECONDS} s"
done
if [ -n "$failed" ]; then
  echo "test: failures on:$failed" >&2
  exit 1
fi
