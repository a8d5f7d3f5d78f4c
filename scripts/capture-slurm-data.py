#!/usr/bin/env python3
"""Capture real Slurm output into tests/data/slurm-<release>/ (what the parser and hook tests read).

    .venv/bin/python scripts/capture-slurm-data.py --slurm 24.11     # as root; builds the root once

Starts a local test cluster of that release (testcluster, port 18080 unless --port) whose prolog,
epilog, EpilogSlurmctld and TaskProlog write their environment to files, and writes:

- the squeue/sinfo output of tests/data/capture.sh (*.bin: a job with "|" in its name and comment, an
  array, a two-node job, a drain and a down, a requeue, other users' hostile names and comments);
- version.txt: ``sinfo --version``; scontrol_show_config.txt: ``scontrol show config``;
- hook-env/*.env: what Prolog, TaskProlog, Epilog and EpilogSlurmctld see (sorted ``env``), for a job
  that exits 3 (epilog_slurmd, epilog_slurmctld_failed), one removed with its node (prolog_slurmd,
  task_prolog, epilog_slurmctld_node_fail), and one each completed, cancelled, timed out and requeued
  by ``scontrol requeue`` (epilog_*_<case>.env), so README's table of what epilogs see is reproducible.

With ``--sacct`` it captures only ``sacct_attempts.txt`` (leaving the other files as they are), on a
cluster with accounting (MariaDB + slurmdbd): ``sacct -n -P -X -D`` of a job that completed, one
requeued by ``scontrol requeue`` then completed, one whose node was removed, one cancelled while
pending and one that failed (exit 3), as ``Slurm.accounting`` asks for them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from slurm_preempt.rehearsal import testcluster as tc
from slurm_preempt.slurm import parse, sacct
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
    if args.sacct:
        return capture_sacct(args, work)
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
    parser.add_argument("--slurm", default="system", help="release: system, 24.11, 25.11, 26.05")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--dir", default="/tmp/slurm-preempt-capture")
    parser.add_argument("--out", type=Path, help="default: tests/data/slurm-<version>")
    parser.add_argument("--sacct", action="store_true", help="only sacct_attempts.txt (with accounting)")
    return parser.parse_args()


def capture_sacct(args: argparse.Namespace, work: Path) -> int:
    spec = tc.ClusterSpec(directory=work, port=args.port, slurm=args.slurm, accounting=True)
    tc.down(work)
    state = tc.up(spec, timeout=180)
    os.environ.update(state.env())
    slurm = Slurm(timeout=30)
    major, minor = slurm.version()
    out = (args.out or ROOT / "tests" / "data" / f"slurm-{major}.{minor:02d}").resolve()
    jobs = work / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    try:
        one = ("--constraint=preemptible", "--nodelist=pre2")
        ids = [_sbatch(slurm, jobs, *one, "--wrap=true"), _sbatch(slurm, jobs, *one, "--wrap=exit 3")]
        requeued = _sbatch(slurm, jobs, *one, "--requeue", "--wrap=sleep 3")
        _wait(lambda: (j := slurm.job(requeued)) and j.running, 60, "a job to requeue")
        time.sleep(1)
        slurm.requeue(requeued)
        removed = _sbatch(
            slurm, jobs, "--requeue", "--constraint=preemptible", "--nodelist=pre1", "--wrap=sleep 600"
        )
        _wait(lambda: (j := slurm.job(removed)) and j.running, 60, "a job to lose its node")
        time.sleep(1)
        tc.remove_node(state, "pre1")
        held = _sbatch(slurm, jobs, "--begin=now+1hour", "--wrap=true")
        slurm.cancel(held)
        ids += [requeued, removed, held]
        _wait(lambda: _released(slurm, requeued), 120, "the requeued job to end")
        slurm.cancel(removed)
        argv = [
            "sacct",
            "-n",
            "-P",
            "-X",
            "-D",
            "--format=" + ",".join(sacct.ACCT_FIELDS),
            "-j",
            ",".join(ids),
        ]
        rows = _wait(lambda: _all_ended(slurm.run(argv), len(ids) + 2), 60, "sacct to hold every attempt")
        _write(out / "sacct_attempts.txt", rows)
    finally:
        tc.down(work)
    print(f"capture: wrote {out / 'sacct_attempts.txt'}")
    return 0


def _released(slurm: Slurm, job_id: str) -> bool:
    """True once the job has ended; past Slurm's requeue hold (BeginTime) by ``starttime=now``."""
    job = slurm.job(job_id)
    if job is not None and job.pending and job.reason == "BeginTime":
        slurm.update_job(job_id, starttime="now")
    return job is None or job.state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")


def _all_ended(text: str, attempts: int) -> str | None:
    """The output once slurmdbd holds every attempt (two requeued ones among them), each ended."""
    rows = sacct.parse_acct(text)
    return text if len(rows) >= attempts and all(r.end for r in rows) else None


def capture(state: tc.ClusterState, out: Path, dumps: Path, jobs: Path) -> None:
    slurm = Slurm(timeout=30)
    jobs.mkdir(parents=True, exist_ok=True)
    (out / "hook-env").mkdir(parents=True, exist_ok=True)
    _write(out / "version.txt", slurm.run(["sinfo", "--version"]))
    _write(out / "scontrol_show_config.txt", slurm.run(["scontrol", "show", "config"]))
    _queue_scene(out)
    _hook_scenes(state, slurm, jobs, out, dumps)


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


def _queue_scene(out: Path) -> None:
    """tests/data/capture.sh: the same scenes as 22.05's, through this release's commands (PATH)."""
    subprocess.run(["bash", str(ROOT / "tests" / "data" / "capture.sh"), str(out)], check=True)


def _hook_scenes(state, slurm: Slurm, jobs: Path, out: Path, dumps: Path) -> None:
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
