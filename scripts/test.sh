#!/usr/bin/env bash
# README command two: set up and run the whole test suite (lint, types, unit and integration tests on a
# real local Slurm cluster), then the cluster tests again on each other Slurm release CI proves.
# Under CI=true a missing Slurm fails the run instead of skipping.
#   SP_TEST_RELEASES="24.11 26.05"  the other releases (each from a Debian root built once, ~40 s, into
#                                   /var/cache/slurm-preempt/roots); "" runs the host's Slurm only
#   SP_TEST_SOURCE_RELEASES="25.11" releases compiled from Slurm's source tarball (SP_SLURM_SOURCE, else
#                                   ../shared/slurm-src; 6-9 min, once); they run SOURCE_TESTS below.
#                                   Without the tarball the tier is left out (one line), under CI=true
#                                   that fails the run; "" leaves them out
#   SP_TEST_PORT=17300              the first cluster's port; each release's cluster 100 above the last
set -euo pipefail
cd "$(dirname "$0")/.."
export WITH_ACCOUNTING="${WITH_ACCOUNTING:-1}"  # slurmdbd + MariaDB for the sacct tests
releases="${SP_TEST_RELEASES-24.11 26.05}"
source_releases="${SP_TEST_SOURCE_RELEASES-25.11}"
# A release built from source runs the cluster tests that prove the chain on it: what Slurm does
# (requeue hold, %r, MaxBatchRequeue, hook environments), a job preempted, told, requeued and running
# again with the watcher, and the hooks' records (not the whole cluster suite: CI's budget).
# On 25.11 also the watcher's pyslurm backend against the CLI (tests/test_pyslurm_cluster.py): pyslurm
# is built once beside the root (`testcluster roots --pyslurm`, 12-15 min on 2 cores, cached).
SOURCE_TESTS=(tests/test_slurm_behaviour.py tests/test_launchhold.py tests/test_hooks_cluster.py tests/test_e2e.py
  tests/test_pyslurm_cluster.py)
PYSLURM_RELEASES=" 25.11 "  # the source-built releases PyPI has a pyslurm for (rehearsal/pyslurmbuild.py)
[ -n "$releases$source_releases" ] && export WITH_SLURM_ROOTS=1  # debootstrap
bash scripts/setup.sh
logs=$(mktemp -d /tmp/sp-test-logs.XXXXXX)
# Compiling a release from source takes minutes: it starts now, niced, beside lint and the unit tests.
declare -A builds=()
for release in $source_releases; do
  pyslurm_option=()
  [[ "$PYSLURM_RELEASES" == *" $release "* ]] && pyslurm_option=(--pyslurm "$release")
  .venv/bin/slurm-preempt testcluster roots --build "$release" "${pyslurm_option[@]}" >"$logs/build-$release.log" 2>&1 &
  builds[$release]=$!
done
# The CPU build of PyTorch, for the torchrun (2-node gloo all-reduce) and torch.distributed tests;
# without it those tests skip and say so, which fails the run under CI=true (tests/conftest.py).
if [ "${WITH_TORCH:-1}" = 1 ] && ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if ! .venv/bin/python -m pip install -q torch==2.13.0 >.venv/torch-install.log 2>&1; then
    echo "test: torch 2.13.0 not installable here (.venv/torch-install.log): the torch tests will skip (a failure under CI=true)"
  fi
fi
# Lightning (the [lightning] extra) for the Lightning callback's tests, on the torch installed above.
if [ "${WITH_TORCH:-1}" = 1 ] && .venv/bin/python -c 'import torch' 2>/dev/null \
    && ! .venv/bin/python -c 'import lightning' 2>/dev/null; then
  if ! .venv/bin/python -m pip install -q lightning==2.6.6 >.venv/lightning-install.log 2>&1; then
    echo "test: lightning 2.6.6 not installable here (.venv/lightning-install.log): its tests will skip (a failure under CI=true)"
  fi
fi
echo "== lint"
.venv/bin/ruff check src tests bench scripts examples
.venv/bin/ruff format --check src tests bench scripts examples
echo "== types"
.venv/bin/mypy
# With no arguments every part must collect tests (pytest's exit 5, none collected, is a failure).
# Arguments choose tests (a file, -k): then a part may hold none of them, and only all parts empty fail.
chosen=$#
empty_parts=0
parts=0
run_pytest() {
  local status=0
  .venv/bin/python -m pytest "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    if [ "$chosen" -eq 0 ]; then
      echo "test: pytest collected no tests: that is a failure" >&2
      return 1
    fi
    echo "test: none of the chosen tests in this part" >&2
    return 5
  fi
  return "$status"
}
failed=""
echo "== unit tests"
SECONDS=0
status=0
run_pytest -m "not cluster" "$@" || status=$?
parts=$((parts + 1))
case "$status" in 0) ;; 5) empty_parts=$((empty_parts + 1)) ;; *) failed+=" unit" ;; esac
echo "test: unit tests: ${SECONDS} s"
if [ -n "$releases" ]; then
  echo "== Slurm roots for: $releases"
  SECONDS=0
  # shellcheck disable=SC2046
  .venv/bin/slurm-preempt testcluster roots $(printf -- '--build %s ' $releases)
  echo "test: roots ready in ${SECONDS} s"
fi
# The cluster tests of each release run side by side, each on its own cluster (own ports, folder,
# munged and database): they mostly wait on Slurm, so the sessions take little more wall time than the
# longest one. Each waits on conditions, never on the clock (tests/clusterutil.py: HUNG_AFTER), so the
# load they put on each other slows them without failing them (issue 29).
declare -A pids=() ports=()
port="${SP_TEST_PORT:-17300}"
for release in system $releases $source_releases; do
  ports[$release]=$port
  port=$((port + 100))
done
start_tier() {  # RELEASE [the command line's tests]
  local release=$1 slurm_option=() chosen_tests=("${@:2}")
  [ "$release" = system ] || slurm_option=(--slurm "$release")
  # A release built from source runs SOURCE_TESTS unless the command line chose tests.
  if [[ " $source_releases " == *" $release "* ]] && [ "$chosen" -eq 0 ]; then
    chosen_tests=("${SOURCE_TESTS[@]}")
  fi
  echo "== cluster tests on Slurm $release (port ${ports[$release]}, log $logs/$release.log)"
  (
    started=$SECONDS
    status=0
    SP_TEST_PORT=${ports[$release]} run_pytest -m cluster "${slurm_option[@]}" "${chosen_tests[@]}" >"$logs/$release.log" 2>&1 || status=$?
    echo "test: Slurm $release: $((SECONDS - started)) s" >>"$logs/$release.log"
    exit "$status"
  ) &
  pids[$release]=$!
}
SECONDS=0
tiers="system $releases"
for release in $tiers; do
  start_tier "$release" "$@"
done
# A release compiled from source starts its tier once its build is done, beside the others, which do
# not wait for it (from an empty cache the Slurm and pyslurm builds outlast the unit tests).
for release in $source_releases; do
  status=0
  wait "${builds[$release]}" || status=$?
  echo "== Slurm $release from source: exit $status, ${SECONDS} s into the cluster tests ($logs/build-$release.log)"
  if [ "$status" -eq 0 ]; then
    tiers+=" $release"
    start_tier "$release" "$@"
  elif [ "$status" -eq 5 ] && [ "${CI:-}" != true ]; then  # no tarball: one line, the tier left out
    echo "test: Slurm $release left out: $(tail -n 1 "$logs/build-$release.log")"
  else
    cat "$logs/build-$release.log"
    failed+=" $release-build"
  fi
done
for release in $tiers; do
  status=0
  wait "${pids[$release]}" || status=$?
  echo "== cluster tests on Slurm $release: exit $status"
  cat "$logs/$release.log"
  parts=$((parts + 1))
  case "$status" in 0) ;; 5) empty_parts=$((empty_parts + 1)) ;; *) failed+=" $release" ;; esac
done
echo "test: cluster tests, all releases side by side: ${SECONDS} s"
if [ "$empty_parts" -eq "$parts" ]; then
  echo "test: pytest collected none of the chosen tests: that is a failure" >&2
  failed+=" (no tests)"
fi
if [ -n "$failed" ]; then
  echo "test: failures on:$failed" >&2
  exit 1
fi
