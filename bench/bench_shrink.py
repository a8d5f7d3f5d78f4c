"""Elastic in place: a 3-node --nodes=2-3 job loses a node that is not its batch host.

On a local cluster of its own (hooks on, the watcher daemon running), the same job is drilled (one node
drained, removed ``GRACE`` seconds later, brought back) with two contenders, alternated, medians:

- shrink: the default for a node range; the job gives the node back and runs its command again on the
  two others in the same attempt (job/shrink.py);
- requeue: the same job with ``--no-shrink``, the path every job took before.

Printed apart: the Slurm part, drain -> the job's next step running (polled with ``squeue -s`` every
0.05 s), and drain -> training again (the ``resumed_from`` the program writes once it restored its
checkpoint), which adds the program's own start-up (imports, rendezvous, restore) on this machine.

    .venv/bin/python bench/run.py --only shrink [--quick]
    .venv/bin/python bench/bench_shrink.py [--quick] [--template plain] [--slurm 24.11]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_preempt import ledger
from slurm_preempt.rehearsal import drill, testcluster, versions

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_sharded.py"
SP = str(Path(sys.executable).parent / "slurm-preempt")
GRACE, STEPS, EVERY = 10.0, 200, 20
PORT = int(os.environ.get("SP_BENCH_PORT", "17420"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _script(work: Path, template: str, shrink: bool) -> Path:
    command = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--every", str(EVERY),
               "--step-seconds", "0.05", "--result", str(work / "result.json")]  # fmt: skip
    options = (
        ["--template", template, "--rdzv-port", str(_free_port())]
        if template == "torchrun"
        else [
            "--ntasks-per-node",
            "1",
            "--env",
            "MASTER_ADDR=127.0.0.1",
            "--env",
            f"MASTER_PORT={_free_port()}",
        ]
    )
    if template != "torchrun":
        command = ["srun", *command]
    script = work / "job.sbatch"
    subprocess.run(
        [SP, "sbatch", "--job-name", "shrink", "--nodes", "2-3", "--chdir", str(work), "--checkpoint-dir",
         str(work / "ckpt"), *options, *([] if shrink else ["--no-shrink"]), "--write", str(script), "--",
         *command], check=True, capture_output=True,
    )  # fmt: skip
    return script


def _steps(slurm, job_id: str) -> set[str]:
    out = slurm.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"])
    return {line.strip() for line in out.splitlines() if line.strip().split(".")[-1].isdigit()}


def _moments(state_dir: Path, job_id: str, kind: str, after: float) -> list[float]:
    """When each ``kind`` event after ``after`` was written (ledger file names start with time_ns)."""
    found = (
        int(p.name.split("-", 1)[0]) / 1e9 for p in ledger.job_dir(state_dir, job_id).glob(f"*-{kind}.json")
    )
    return sorted(at for at in found if at >= after)


def _one(state, folder: Path, template: str, shrink: bool, round_no: int) -> dict:
    slurm = state.slurm(timeout=30)
    work = folder / f"{template}-{'shrink' if shrink else 'requeue'}-{round_no}"
    work.mkdir(parents=True)
    job_id = slurm.submit(str(_script(work, template, shrink)))
    while not (job := slurm.job(job_id)) or not job.running or len(job.nodes) != 3:
        time.sleep(0.2)
    while not list((work / "ckpt").glob("step-*")):
        time.sleep(0.2)
    first_steps, leaving = _steps(slurm, job_id), job.nodes[1]
    runner = drill.Drill(slurm, drill.node_ops(slurm, allow_real=False), state.spec.state_dir, tick=0.05)
    event = runner.start_event([leaving], GRACE, 1, drill.DEFAULT_REASON)
    step_at = ended_at = drained_at = None
    while step_at is None and time.time() < event.drain_at + 120:
        now = time.time()
        runner.step(now)
        job, steps = slurm.job(job_id), _steps(slurm, job_id)
        if ended_at is None and not steps & first_steps:
            ended_at = now
        if job and job.running and (steps - first_steps or job.restart_count > 0):
            step_at = now
        time.sleep(0.05)
    while drained_at is None and event.removed_at is None and shrink:
        (node,) = slurm.nodes(names=[leaving])
        drained_at = time.time() if node.drain and not node.draining else None  # IDLE+DRAIN: DRAINED
        runner.step(time.time())
        time.sleep(0.05)
    runner.run_until_done(timeout=120)
    while not (work / "result.json").exists():
        time.sleep(0.5)
    trained = _moments(state.spec.state_dir, job_id, "resumed_from", event.drain_at)
    return {
        "slurm_part": step_at - event.drain_at if step_at else None,
        "step_ended_to_next_step": step_at - ended_at if step_at and ended_at else None,
        "training_again": trained[0] - event.drain_at if trained else None,
        "same_attempt": json.loads((work / "result.json").read_text())["attempt"] == 1,
        "prologs_after_drain": len(_moments(state.spec.state_dir, job_id, "attempt_start", event.drain_at)),
        "drained_before_removal": drained_at is not None,
    }


def run(quick: bool = False, template: str = "torchrun", slurm: str = versions.SYSTEM) -> list[dict]:
    if os.geteuid() != 0:
        raise RuntimeError("needs root and Slurm (it starts a local cluster)")
    rounds = 1 if quick else 3
    folder = Path(tempfile.mkdtemp(prefix="sp-bench-shrink-"))
    spec = testcluster.ClusterSpec(
        directory=folder / "cluster", standard=1, preemptible=4, port=PORT, hooks=True, slurm=slurm
    )
    state = testcluster.up(spec)
    env = {**os.environ, **state.env()}
    watcher = subprocess.Popen(
        [SP, "watch", "--cluster", "--interval", "0.5", "--grace", str(GRACE), "--allow-preemptible-host"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    results: dict[bool, list[dict]] = {True: [], False: []}
    try:
        os.environ.update(state.env())
        for round_no in range(rounds):
            for shrink in (True, False) if round_no % 2 == 0 else (False, True):  # alternated
                results[shrink].append(_one(state, folder, template, shrink, round_no))
                print(json.dumps({"shrink": shrink, **results[shrink][-1]}), file=sys.stderr)
    finally:
        watcher.terminate()
        watcher.wait(10)
        testcluster.down(spec.directory)
    return _rows(results, template, slurm)


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return round(statistics.median(values), 2) if values else None


def _rows(results: dict[bool, list[dict]], template: str, slurm: str) -> list[dict]:
    rows = []
    for key, what, target in (
        ("slurm_part", "drain -> next step running", "notice, final checkpoint, exit, shrink"),
        ("step_ended_to_next_step", "the step ended -> next step running", "<= 1 s"),
        ("training_again", "drain -> training again", ""),
    ):
        value, baseline = _median(results[True], key), _median(results[False], key)
        rows.append({
            "name": f"{template} 3 -> 2 nodes, Slurm {slurm}: {what}", "value": value, "unit": "s",
            "baseline": baseline, "ratio": round(value / baseline, 3) if value and baseline else None,
            "target": target or "vs --no-shrink (requeue), same run",
        })  # fmt: skip
    shrunk = results[True]
    rows.append({
        "name": f"{template} shrink: same attempt, no prolog, the node left DRAINED before its removal",
        "value": all(
            r["same_attempt"] and not r["prologs_after_drain"] and r["drained_before_removal"] for r in shrunk
        ),
        "unit": "", "baseline": None, "ratio": None, "target": "True",
    })  # fmt: skip
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--template", choices=("torchrun", "plain"), default="torchrun")
    parser.add_argument("--slurm", default=versions.SYSTEM)
    args = parser.parse_args()
    for row in run(args.quick, args.template, args.slurm):
        print(json.dumps(row))
