#!/bin/bash
# Captures the squeue/sinfo output that tests/test_parse.py parses, from a real cluster, in the
# exact format slurm_preempt.slurm.commands asks for (SLURM_TIME_FORMAT=%s, fixed-width text fields).
#
#   .venv/bin/slurm-preempt testcluster up --port 18250 --dir /tmp/capture-cluster --preemptible 4 --standard 2
#   SLURM_CONF=/tmp/capture-cluster/etc/slurm.conf bash tests/data/capture.sh tests/data/slurm-22.05
#
# Needs root (it drains nodes and submits as the unprivileged users sp-alice and sp-mallory, created
# when missing) and a cluster with nodes pre1..pre4 and std1..std2 and no jobs.
# Other releases: scripts/capture-slurm-data.py --slurm 24.11 (or 26.05) runs this on a cluster of
# that release, through its commands, and captures what its hooks see too. Job ids and times
# differ on every run: update the figures in tests/test_parse.py after a new capture.
set -euo pipefail
out=${1:?usage: capture.sh OUTPUT_FOLDER}
here=$(cd "$(dirname "$0")/../.." && pwd)
py=$here/.venv/bin/python
export SLURM_TIME_FORMAT=%s
jf=$("$py" -c "from slurm_preempt.slurm import parse as p; print(p.format_arg(p.JOB_FIELDS, p.JOB_TEXT_FIELDS))")
nf=$("$py" -c "from slurm_preempt.slurm import parse as p; print(p.format_arg(p.NODE_FIELDS, p.NODE_TEXT_FIELDS))")
for user in sp-alice sp-mallory; do
	id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
done
running() { for _ in $(seq 60); do [ "$(squeue -h -t running -o %i | wc -l)" = "$1" ] && return 0; sleep 1; done; return 1; }
sub() { sbatch --parsable -o /dev/null --chdir /tmp "$@"; }

# Plain jobs: a name and comment with spaces and pipes, an array, a two-node job; a drain and a down.
a=$(sub -J "train | big run" --comment "slurm-preempt:signal=USR1 with spaces | pipes" -C preemptible \
	--requeue -w pre1 --wrap 'sleep 1000')
sub -J sweep --array=0-2 -C preemptible -w pre2 --wrap 'sleep 1000' >/dev/null
sub -J two -N 2 -C standard --wrap 'sleep 1000' >/dev/null
running 5
scontrol update nodename=pre1 state=drain reason="TogetherPreemptionNotified: node reclaimed"
scontrol update nodename=pre4 state=down reason="hw fault | ecc"
sleep 1
squeue -h -O "$jf" >"$out/squeue_jobs_running.bin"
sinfo -h -N -O "$nf" >"$out/sinfo_nodes.bin"
scontrol requeue "$a"
sleep 4
squeue -h -O "$jf" >"$out/squeue_jobs_requeued.bin"
scancel -u root
sleep 3
for node in pre1 pre4; do scontrol update nodename="$node" state=resume; done

# Hostile: another user's job names and comments hold newlines, separators, a forged record naming
# the victim's job, invalid UTF-8 and every character str.splitlines() breaks at.
sep=$(printf '\037')
victim=$(runuser -u sp-alice -- sbatch --parsable -o /dev/null --chdir /tmp -J victim \
	--comment "slurm-preempt:signal=USR1" -w pre2 --wrap 'sleep 1000')
forged="${victim}${sep}${victim}${sep}N/A${sep}RUNNING${sep}pre1${sep}0${sep}sp-alice${sep}batch${sep}1${sep}1${sep}1${sep}1${sep}None"
runuser -u sp-mallory -- sbatch --parsable -o /dev/null --chdir /tmp -w pre1 \
	-J "$(printf 'x\n--partition=batch\037\377\r\302\205')" \
	--comment "$(printf 'slurm-preempt:signal=USR1\n%s' "$forged")" --wrap 'sleep 1000' >/dev/null
runuser -u sp-mallory -- sbatch --parsable -o /dev/null --chdir /tmp -w pre1 \
	-J "$(printf '\342\200\250\034\035\036\v\f')" \
	--comment "$(printf '\377\376 slurm-preempt:fallback-after=\302\262 \n424242\037')" --wrap 'sleep 1000' >/dev/null
running 3
squeue -h -O "$jf" >"$out/squeue_jobs_hostile.bin"
scontrol update nodename=pre2 state=drain \
	reason="$(printf 'Together\npre3\037idle+drain\037preemptible\0371\037root(0)\037TogetherPreemptionNotified\377')"
sleep 1
sinfo -h -N -O "$nf" >"$out/sinfo_nodes_hostile.bin"
scancel -u sp-alice
scancel -u sp-mallory
scontrol update nodename=pre2 state=resume
echo "victim job $victim; captured into $out"
