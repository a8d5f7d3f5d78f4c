#!/usr/bin/env bash
# README command one: from a fresh Debian/Ubuntu machine (as root) to a job that is preempted three
# times on a local Slurm cluster and still finishes with the result of an uninterrupted run.
#
#   1. install Slurm + munge and slurm-preempt (scripts/setup.sh)
#   2. start a local cluster (2 standard + 4 preemptible nodes) with the prolog/epilog hooks installed
#   3. start the drain watcher (cluster daemon, 1 s poll, 20 s grace instead of the real 300 s)
#   4. generate the job with `slurm-preempt sbatch` and submit it: examples/train_loop.py, a deterministic
#      loop that uses the resume library
#   5. preempt its node three times with `slurm-preempt drill` (drain at T+0, remove at T+20 s, back later)
#   6. compare its result with an uninterrupted run; show `history` and write the timeline picture
#
# Environment: DEMO_DIR (work folder, default ./out/demo), DEMO_PREEMPTIONS (3), DEMO_GRACE (20),
# DEMO_SLURM (the Slurm release: system, 24.11 or 26.05; see `slurm-preempt testcluster up --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "setup: Slurm, munge and slurm-preempt"
bash scripts/setup.sh
sp=$repo/.venv/bin/slurm-preempt
py=$repo/.venv/bin/python
work=${DEMO_DIR:-$repo/out/demo}
cluster=$work/cluster
preemptions=${DEMO_PREEMPTIONS:-3}
grace=${DEMO_GRACE:-20}
steps=1200
rm -rf "$work/job" "$work/expected.json"
mkdir -p "$work/job"

say "local cluster with the hooks installed"
"$sp" testcluster up --dir "$cluster" --port "${DEMO_PORT:-17200}" --hooks --slurm "${DEMO_SLURM:-system}"
eval "$("$sp" testcluster env --dir "$cluster")"
sinfo -N -o "%N %f %T"

watcher_pid=""
cleanup() { [ -n "$watcher_pid" ] && kill "$watcher_pid" 2>/dev/null || true; }
trap cleanup EXIT

say "drain watcher: one poll per second, deadline = drain time + ${grace} s"
"$sp" watch --cluster --interval 1 --grace "$grace" --allow-preemptible-host >"$work/watch.log" 2>&1 &
watcher_pid=$!
echo "watcher pid $watcher_pid, log $work/watch.log"

say "the reference: the same computation without interruption"
"$py" examples/train_loop.py --checkpoint-dir "$work/reference-ckpt" --steps "$steps" --every 50 \
    --step-seconds 0 --result "$work/expected.json"
rm -rf "$work/reference-ckpt"
cat "$work/expected.json"; echo

say "the job script, generated"
job_options=(--job-name demo --chdir "$work/job" --checkpoint-dir "$work/job/ckpt" --grace "$grace")
job_command=("$py" "$repo/examples/train_loop.py" --steps "$steps" --every 50 --step-seconds 0.1
             --result "$work/job/result.json")
"$sp" sbatch "${job_options[@]}" --write "$work/job/demo.sbatch" -- "${job_command[@]}"
grep -E '^#SBATCH' "$work/job/demo.sbatch"
"$sp" sbatch "${job_options[@]}" --explain -- "${job_command[@]}" | fold -s -w 110 | sed 's/^/  /'

say "submit"
job=$(sbatch --parsable "$work/job/demo.sbatch")
echo "job $job"
wait_running() {
    for _ in $(seq 1 600); do
        state=$(squeue -h -j "$job" -o "%T %N" 2>/dev/null || true)
        case "$state" in RUNNING*) echo "job $job running on ${state#RUNNING }"; return 0 ;; esac
        [ -f "$work/job/result.json" ] && return 1
        sleep 0.5
    done
    echo "job $job did not run within 300 s" >&2; return 1
}

for round in $(seq 1 "$preemptions"); do
    wait_running || break
    sleep 8  # let it compute (and checkpoint) for a while
    say "preemption $round of $preemptions: drain now, remove at T+${grace} s"
    "$sp" drill --job "$job" --grace "$grace" --pause 3 --timeout 120
done

say "waiting for the job to finish"
for _ in $(seq 1 900); do
    [ -f "$work/job/result.json" ] && ! squeue -h -j "$job" -t running,pending 2>/dev/null | grep -q . && break
    sleep 1
done
echo "expected: $(cat "$work/expected.json")"
echo "got:      $(cat "$work/job/result.json")"
"$py" - "$work/expected.json" "$work/job/result.json" <<'PY'
import json, sys
expected, got = (json.load(open(p)) for p in sys.argv[1:3])
if expected["value"] != got["value"]:
    sys.exit(f"MISMATCH: {got['value']} != {expected['value']}")
print(f"same result as the uninterrupted run after {got['attempt']} attempts on {' -> '.join(got['nodes'])}")
PY

say "history of job $job"
"$sp" history "$job" --timeline "$work/timeline.html"
echo
echo "timeline picture: $work/timeline.html"
echo "job log:          $(ls "$work/job/demo-$job"*.out | tr '\n' ' ')"
echo "watcher log:      $work/watch.log"
echo "the cluster is still up: eval \"\$($sp testcluster env --dir $cluster)\"; stop it with:"
echo "  $sp testcluster down --dir $cluster"
