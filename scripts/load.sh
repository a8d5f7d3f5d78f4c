#!/usr/bin/env bash
# Loads this machine the way a shared CI host is loaded, to prove the test suite holds under it
# (issue 29): two busy loops (one per core of the 2-core CI machine) and a writer that keeps the disk
# busy (64 MiB files rewritten and fsynced, in a private temporary folder). It stops by itself after
# --seconds (default 3 hours), or at once on Ctrl-C / SIGTERM, and removes what it wrote.
#   bash scripts/load.sh --seconds 3600 &     # then run the suite beside it
#   bash scripts/load.sh --busy 4 --seconds 600
set -euo pipefail
seconds=10800
busy=2
usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --busy) busy="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "load: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$seconds$busy" in *[!0-9]*) echo "load: --seconds and --busy take whole numbers" >&2; exit 2 ;; esac
scratch=$(mktemp -d /tmp/sp-load.XXXXXX)
pids=()
stop() {
  trap - EXIT INT TERM
  local pid
  for pid in "${pids[@]}"; do
    pkill -TERM -P "$pid" 2>/dev/null || true  # the writer's dd, which outlives a killed loop
    kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap stop EXIT
trap 'exit 0' INT TERM
for _ in $(seq "$busy"); do
  bash -c 'while [ "$SECONDS" -lt "$1" ]; do :; done' _ "$seconds" &
  pids+=($!)
done
bash -c '
  i=0
  while [ "$SECONDS" -lt "$2" ]; do
    dd if=/dev/urandom of="$1/w$((i % 4))" bs=1M count=64 conv=fsync status=none
    i=$((i + 1))
  done' _ "$scratch" "$seconds" &
pids+=($!)
echo "load: ${busy} busy loops and a writer in $scratch for up to ${seconds} s (pids ${pids[*]})"
wait
