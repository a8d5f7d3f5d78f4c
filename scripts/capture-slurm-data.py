#!/usr/bin/env python3
"""Capture real Slurm output into tests/data/slurm-<version>/ (what the parser and hook tests read).

    .venv/bin/python scripts/capture-slurm-data.py --slurm 24.11     # as root; builds the root once

Starts a local test cluster of that release (testcluster, port 18080 unless --port) with hooks that
write their environment to files, runs the jobs the tests talk about, and writes:

- version.txt: ``sinfo --version``; scontrol_show_config.txt: ``scontrol show config``;
- sinfo_nodes.txt / sinfo_nodes_removed.txt: ``sinfo -N -O`` with the fields slurm-preempt asks for,
  with pre1 draining under a job, pre4 down with a "|" in its reason, then pre1 removed;
- squeue_jobs_running.txt / squeue_jobs_requeued.txt: ``squeue -O`` with a job whose name and comment
  hold "|" and spaces, a 3-task array, a 2-node job; then the first job requeued by the removal;
- hook-env/*.env: what Prolog, TaskProlog, Epilog and EpilogSlurmctld see (sorted ``env``), for a job
  that exits 3 (epilog_slurmd, epilog_slurmctld_failed), one removed with its node (prolog_slurmd,
  task_prolog, epilog_slurmctld_node_fail), and one each completed, cancelled, timed out and requeued
  by ``scontrol requeue`` (epilog_*_<case>.env), so the README table of what epilogs see is reproducible.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from slurm_preempt.rehearsal import testcluster as tc
from slurm_preempt.slurm import parse
from slurm_preempt.slurm.commands import Slurm

ROOT = Path(__file__).resolve().parents[1]
DUMP = """#!/bin/sh
# Write what this hook sees; never fail (a failing prolog drains the node).
out={out}/$SLURM_SCRIPT_CONTEXT-${{SLURM_JOB_ID:-none}}-${{SLURM_JOB_RESTART_COUNT:-x}}.env
env | LC_ALL=C sort >"$out.tmp" 2>/dev/null && mv "$out.tmp" "$out"
exit 0
"""


def main() -> int:
    args = _arguments()
    work = Path(args.dir)
    dumps = work.parent / (work.name + "-hook-env")
    shutil.rmtree(dumps, ignore_errors=True)
    dumps.mkdir(parents=True)
    hook = dumps / "dump.sh"
    hook.write_text(DUMP.format(out=dumps))
    hook.chmod(0o755)
    spec = tc.ClusterSpec(
        directory=work,
        port=args.port,
        slurm=args.slurm,
        extra_conf=(
            f"Prolog={hook}",
            f"Epilog={hook}",
            "PrologFlags=Alloc",
            f"TaskProlog={hook}",
            f"EpilogSlurmctld={hook}",
        ),
    )
    tc.down(work)
    state = tc.up(spec, timeout=120)
    os.environ.update(state.env())
    major, minor = Slurm().version()
    out = (args.out or ROOT / "tests" / "data" / f"slurm-{major}.{minor:02d}").resolve()
    try:
        capture(state, out, dumps, work / "jobs")
    finally:
        tc.down(work)
    print(f"capture: wrote {out}")
    return 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slurm", default="system", help="release: system, 24.11, 26.05")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--dir", default="/tmp/slurm-preempt-capture")
    parser.add_argument("--out", type=Path, help="default: tests/data/slurm-<version>")
    return parser.parse_args()


def capture(state: tc.ClusterState, out: Path, dumps: Path, jobs: Path) -> None:
    slurm = Slurm(timeout=30)
    jobs.mkdir(parents=True, exist_ok=True)
    (out / "hook-env").mkdir(parents=True, exist_ok=True)
    _write(out / "version.txt", slurm.run(["sinfo", "--version"]))
    _write(out / "scontrol_show_config.txt", slurm.run(["scontrol", "show", "config"]))
    queue = _queue_scene(state, slurm, jobs, out)
    _hook_scenes(state, slurm, jobs, out, dumps, queue)


def _sbatch(slurm: Slurm, jobs: Path, *args: str) -> str:
    return parse.parse_submitted(
        slurm.run(["sbatch", "--parsable", f"--chdir={jobs}", "--output=/dev/null", *args])
    )


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise SystemExit(f"capture: timed out waiting for {what}")


def _nodes_text(slurm: Slurm) -> str:
    return slurm.run(["sinfo", "-h", "-N", "-O", parse.format_arg(parse.NODE_FIELDS)])


def _jobs_text(slurm: Slurm) -> str:
    return slurm.run(["squeue", "-h", "-O", parse.format_arg(parse.JOB_FIELDS)])


def _queue_scene(state, slurm: Slurm, jobs: Path, out: Path) -> str:
    train = _sbatch(
        slurm,
        jobs,
        "--requeue",
        "--job-name=train | big run",
        "--comment=slurm-preempt:notify=USR1; with spaces | pipes",
        "--constraint=preemptible",
        "--nodelist=pre1",
        "--wrap=sleep 600",
    )
    _sbatch(slurm, jobs, "--job-name=sweep", "--array=0-2", "--nodelist=pre2", "--wrap=sleep 600")
    _sbatch(slurm, jobs, "--job-name=two", "--nodes=2", "--constraint=standard", "--wrap=sleep 600")
    _wait(lambda: len([j for j in slurm.jobs() if j.running]) == 5, 60, "five running jobs")
    slurm.drain(["pre1"], "TogetherPreemptionNotified: node reclaimed")
    slurm.set_down(["pre4"], "hw fault | ecc")
    _write(out / "sinfo_nodes.txt", _nodes_text(slurm))
    _write(out / "squeue_jobs_running.txt", _jobs_text(slurm))
    tc.remove_node(state, "pre1")
    _write(out / "sinfo_nodes_removed.txt", _nodes_text(slurm))
    _wait(lambda: (j := slurm.job(train)) and j.reason == "BeginTime", 60, "the requeued job's BeginTime")
    _write(out / "squeue_jobs_requeued.txt", _jobs_text(slurm))
    slurm.run(["scancel", "-u", "root"])
    _wait(lambda: not slurm.jobs(states="running,completing,pending"), 60, "the queue to empty")
    tc.revive_node(state, "pre1")
    slurm.resume(["pre4"])
    return train


def _hook_scenes(state, slurm: Slurm, jobs: Path, out: Path, dumps: Path, _queue: str) -> None:
    one = ("--constraint=preemptible", "--nodelist=pre2")
    cases = {
        "failed": _sbatch(slurm, jobs, *one, "--wrap=exit 3"),
        "completed": _sbatch(slurm, jobs, *one, "--wrap=true"),
        "timeout": _sbatch(slurm, jobs, *one, "--time=1", "--wrap=sleep 600"),
    }
    cancelled = _sbatch(slurm, jobs, *one, "--wrap=sleep 600")
    _wait(lambda: (j := slurm.job(cancelled)) and j.running, 60, "a job to cancel")
    time.sleep(1)
    slurm.cancel(cancelled)
    cases["cancelled"] = cancelled
    requeued = _sbatch(slurm, jobs, *one, "--requeue", "--wrap=sleep 600")
    _wait(lambda: (j := slurm.job(requeued)) and j.running, 60, "a job to requeue")
    time.sleep(1)
    slurm.requeue(requeued)
    cases["requeued"] = requeued
    removed = _sbatch(
        slurm,
        jobs,
        "--requeue",
        "--comment=x y",
        "--constraint=preemptible",
        "--nodelist=pre1",
        "--wrap=sleep 600",
    )
    _wait(lambda: _dump(dumps, "prolog_task", removed), 60, "the removed job's TaskProlog")
    tc.remove_node(state, "pre1")
    cases["node_fail"] = removed
    _wait(lambda: _dump(dumps, "epilog_slurmctld", removed), 60, "EpilogSlurmctld of the removed job")
    # The timeout case needs its minute; the others are done by then.
    _wait(lambda: _dump(dumps, "epilog_slurmctld", cases["timeout"]), 150, "EpilogSlurmctld of the timeout")
    for case, job in cases.items():
        # A removed node runs no epilog of its own: only EpilogSlurmctld sees that end.
        contexts = ["epilog_slurmctld"] + ([] if case == "node_fail" else ["epilog_slurmd"])
        for context in contexts:
            found = _wait(lambda c=context, j=job: _dump(dumps, c, j), 60, f"{context} of job {job}")
            shutil.copy(found, out / "hook-env" / f"{context}_{case}.env")
    shutil.copy(_dump(dumps, "prolog_slurmd", removed), out / "hook-env" / "prolog_slurmd.env")
    shutil.copy(_dump(dumps, "prolog_task", removed), out / "hook-env" / "task_prolog.env")
    # The names the 22.05 capture used for the same cases.
    hook_env = out / "hook-env"
    shutil.copy(hook_env / "epilog_slurmd_failed.env", hook_env / "epilog_slurmd.env")
    (hook_env / "epilog_slurmd_failed.env").unlink()


def _dump(dumps: Path, context: str, job: str) -> Path | None:
    found = sorted(dumps.glob(f"{context}-{job}-*.env"))
    return found[0] if found else None


def _write(path: Path, text: str) -> None:
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
