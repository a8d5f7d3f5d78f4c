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

``--leave``: the requeue path of a 2-node torchrun job (no range) on a cluster with Slurm's default
KillWait (30 s), drilled ``--rounds`` times, each drill's phases printed: notice (drain -> the watcher's
notice), checkpoint (-> the final checkpoint durable), leave (-> the job's step gone), wait (-> Slurm's
next attempt RUNNING), start (-> its prolog's ``attempt_start``), program start-up (-> the program
restoring, its ``resumed_from``), with the medians.

    .venv/bin/python bench/bench_shrink.py --leave [--rounds 3] [--kill-wait 30] [--slurm 26.05]
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
from slurm_preempt.rehearsal.clusterspec import BENCH_PORT

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_sharded.py"
SP = str(Path(sys.executable).parent / "slurm-preempt")
GRACE, STEPS, EVERY = 10.0, 200, 20
PORT = int(os.environ.get("SP_BENCH_PORT", str(BENCH_PORT)))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _script(work: Path, template: str, shrink: bool, nodes: str = "2-3") -> Path:
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
        [SP, "sbatch", "--job-name", "shrink", "--nodes", nodes, "--chdir", str(work), "--checkpoint-dir",
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


LEAVE_PHASES = ("notice", "checkpoint", "leave", "wait", "start", "program start-up")


def _final_checkpoint_at(state_dir: Path, job_id: str, after: float) -> float | None:
    for path in sorted(ledger.job_dir(state_dir, job_id).glob("*-checkpoint_saved.json")):
        at = int(path.name.split("-", 1)[0]) / 1e9
        if at >= after and json.loads(path.read_text()).get("final"):
            return at
    return None


def _leave_one(state, folder: Path, round_no: int) -> dict:
    """One drill of a 2-node torchrun job on the requeue path: the moment each phase ended."""
    slurm = state.slurm(timeout=30)
    work = folder / f"leave-{round_no}"
    work.mkdir(parents=True)
    job_id = slurm.submit(str(_script(work, "torchrun", shrink=False, nodes="2")))
    while not (job := slurm.job(job_id)) or not job.running or len(job.nodes) != 2:
        time.sleep(0.2)
    while not list((work / "ckpt").glob("step-*")):
        time.sleep(0.2)
    first_steps = _steps(slurm, job_id)
    runner = drill.Drill(slurm, drill.node_ops(slurm, allow_real=False), state.spec.state_dir, tick=0.05)
    event = runner.start_event([job.nodes[0]], GRACE, 1, drill.DEFAULT_REASON)
    gone_at = running_at = None
    while running_at is None and time.time() < event.drain_at + 120:
        now = time.time()
        runner.step(now)
        if gone_at is None and not _steps(slurm, job_id) & first_steps:
            gone_at = now
        if (job := slurm.job(job_id)) and job.running and job.restart_count > 0:
            running_at = now
        time.sleep(0.05)
    runner.run_until_done(timeout=120)
    while not (work / "result.json").exists():
        time.sleep(0.5)
    state_dir, after = state.spec.state_dir, event.drain_at

    def first(kind: str) -> float | None:
        found = _moments(state_dir, job_id, kind, after)
        return found[0] if found else None

    ends = (first("notice_sent"), _final_checkpoint_at(state_dir, job_id, after), gone_at, running_at,
            first("attempt_start"), first("resumed_from"))  # fmt: skip
    phases, previous = {}, after
    for name, end in zip(LEAVE_PHASES, ends, strict=True):
        phases[name] = round(end - previous, 2) if end is not None and previous is not None else None
        previous = end
    return {
        "job": job_id,
        "phases": phases,
        "drain_to_running_again": round(running_at - after, 2) if running_at else None,
        "drain_to_training_again": round(ends[-1] - after, 2) if ends[-1] else None,
        "attempt": json.loads((work / "result.json").read_text())["attempt"],
    }


def run_leave(rounds: int = 3, slurm: str = versions.SYSTEM, kill_wait: int = 30) -> list[dict]:
    """``--leave``: the 2-node torchrun drill, ``rounds`` times, on a cluster with KillWait ``kill_wait``."""
    if os.geteuid() != 0:
        raise RuntimeError("needs root and Slurm (it starts a local cluster)")
    folder = Path(tempfile.mkdtemp(prefix="sp-bench-leave-"))
    spec = testcluster.ClusterSpec(
        directory=folder / "cluster", standard=1, preemptible=4, port=PORT, hooks=True, slurm=slurm,
        kill_wait=kill_wait,
    )  # fmt: skip
    state = testcluster.up(spec)
    env = {**os.environ, **state.env()}
    watcher = subprocess.Popen(
        [SP, "watch", "--cluster", "--interval", "0.5", "--grace", str(GRACE), "--allow-preemptible-host"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    drills = []
    try:
        os.environ.update(state.env())
        for round_no in range(rounds):
            drills.append(_leave_one(state, folder, round_no))
            print(json.dumps(drills[-1]), file=sys.stderr)
    finally:
        watcher.terminate()
        watcher.wait(10)
        testcluster.down(spec.directory)
    return _leave_rows(drills, slurm, kill_wait)


def _leave_rows(drills: list[dict], slurm: str, kill_wait: int) -> list[dict]:
    where = f"torchrun 2 nodes, requeue, Slurm {slurm}, KillWait {kill_wait} s"
    rows = [{"name": f"{where}: {name} (median of {len(drills)}, each ending at the phase's end)",
             "value": _median([d["phases"] for d in drills], name), "unit": "s", "baseline": None,
             "ratio": None, "target": ""} for name in LEAVE_PHASES]  # fmt: skip
    for key, target in (("drain_to_running_again", "<= 4 s"), ("drain_to_training_again", "")):
        spread = sorted(d[key] for d in drills if d[key] is not None)
        rows.append({"name": f"{where}: {key.replace('_', ' ')} (min..max {spread[0]}..{spread[-1]})"
                     if spread else f"{where}: {key}", "value": _median(drills, key), "unit": "s",
                     "baseline": None, "ratio": None, "target": target})  # fmt: skip
    rows.append(
        {
            "name": f"{where}: every drill resumed in attempt 2",
            "value": all(d["attempt"] == 2 for d in drills),
            "unit": "",
            "baseline": None,
            "ratio": None,
            "target": "True",
        }
    )
    return rows


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
    parser.add_argument("--leave", action="store_true", help="the 2-node torchrun requeue drill, in phases")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-wait", type=int, default=30)
    args = parser.parse_args()
    rows = (
        run_leave(args.rounds, args.slurm, args.kill_wait)
        if args.leave
        else run(args.quick, args.template, args.slurm)
    )
    for row in rows:
        print(json.dumps(row))
