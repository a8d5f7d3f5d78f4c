"""The whole chain under a Poisson preemption trace, on a local cluster of its own.

A deterministic job (examples/train_loop.py, generated with `slurm-preempt sbatch`) runs W seconds of
work while `slurm-preempt drill --random` preempts nodes with a mean time M between preemptions. Run
twice on the same trace (same seed):

- with notices: the watcher daemon tells the job, which checkpoints and leaves before the removal, and
  releases it from Slurm's requeue hold;
- without notices (watcher off): the job is killed by the removal and loses the work since its last
  periodic checkpoint; the benchmark itself releases the requeued job (`starttime=now`) so that the
  comparison isolates lost work from Slurm's ~121 s hold.

Figures: goodput (W / wall time) against the Young/Daly optimum for the same checkpoint cost C, restart
cost R and M (waste = C/T + T/(2M) + R/M at T = sqrt(2CM), the best a job without notices can expect);
work lost per preemption with and without notices; and the drain -> running-again time broken into
notice, final checkpoint, leaving, waiting and start.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_preempt import ledger
from slurm_preempt.notice import from_text
from slurm_preempt.records import history
from slurm_preempt.rehearsal import drill, testcluster

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_loop.py"
SP = str(Path(sys.executable).parent / "slurm-preempt")
GRACE, STEP_SECONDS, EVERY = 6.0, 0.05, 40


def _times(events: list[dict], kind: str) -> list[float]:
    return [from_text(e["time"]).timestamp() for e in events if e["kind"] == kind]


def _run_trace(state, workdir: Path, steps: int, mtbp: float, seed: int, notices: bool) -> dict:
    env = {**os.environ, **state.env()}
    slurm = state.slurm(timeout=30)
    work = workdir / ("with" if notices else "without")
    work.mkdir(parents=True)
    script = work / "job.sbatch"
    subprocess.run(
        [SP, "sbatch", "--job-name", "bench", "--chdir", str(work), "--checkpoint-dir", str(work / "ckpt"),
         "--write", str(script), "--", sys.executable, str(EXAMPLE), "--steps", str(steps), "--every",
         str(EVERY), "--step-seconds", str(STEP_SECONDS), "--result", str(work / "result.json")],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    watcher = None
    if notices:
        watcher = subprocess.Popen(
            [SP, "watch", "--cluster", "--interval", "1", "--grace", str(GRACE), "--allow-preemptible-host"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    job_id = slurm.submit(str(script))
    try:
        while not (j := slurm.job(job_id)) or not j.running:
            time.sleep(0.2)
        began = time.time()
        runner = drill.Drill(slurm, drill.node_ops(slurm, allow_real=False), state.spec.state_dir, tick=0.2)
        rng = random.Random(seed)
        next_at = began + rng.expovariate(1 / mtbp)
        # Poisson preemptions of whatever nodes the job runs on, until it is done; with the watcher
        # off, the benchmark releases requeued jobs itself (lost work, not Slurm's hold, is measured).
        while not (work / "result.json").exists():
            now = time.time()
            job = slurm.job(job_id)
            busy = {n for e in runner.events if e.revived_at is None for n in e.nodes}
            if now >= next_at and job and job.running and not busy & set(job.nodes):
                runner.start_event(job.nodes, GRACE, 1, drill.DEFAULT_REASON)
                next_at = now + rng.expovariate(1 / mtbp)
            if not notices and job and job.pending and job.reason == "BeginTime":
                slurm.update_job(job_id, starttime="now")
            runner.step(now)
            time.sleep(0.2)
        wall = time.time() - began
        runner.run_until_done(timeout=30)  # bring the last nodes back
    finally:
        if watcher:
            watcher.terminate()
            watcher.wait(10)
    events = ledger.events(state.spec.state_dir, job_id)
    saves = [e.get("seconds", 0.0) for e in events if e["kind"] == "checkpoint_saved"]
    starts = _times(events, "resumed_from")
    watches = [w for e in runner.events for w in e.jobs.values() if w.job_id == job_id]
    # Work lost: `slurm-preempt history`'s one definition (Attempt.lost_seconds), from the hooks' records
    # and sacct. sacct is needed here: a node the drill brings back a second after its removal runs
    # the killed job's epilog at once, which the ledger alone reads as a plain requeue.
    found = history.load(job_id, state.spec.state_dir, slurm)
    (work / "history.json").write_text(json.dumps(found.to_json(), indent=1))  # to look at afterwards
    lost = [a.lost_seconds for a in found.attempts if a.preempted]
    phases: dict[str, list[float]] = {name: [] for name in drill.PHASES}
    for event, watch in ((e, w) for e in runner.events for w in e.jobs.values() if w.job_id == job_id):
        if notices:
            for name, seconds in (drill.told_phases(event, watch, starts) or {}).items():
                phases[name].append(seconds)
    return {
        "wall": wall,
        "work": steps * STEP_SECONDS,
        "preemptions": len(watches),
        "lost": lost,
        "checkpoint_cost": statistics.median(saves) if saves else 0.0,
        "restart": statistics.median(phases["wait"] + phases["start"]) if phases["wait"] else 3.0,
        "phases": phases,
        "value": json.loads((work / "result.json").read_text())["value"],
    }


def young_daly_goodput(checkpoint: float, restart: float, mtbp: float) -> float:
    interval = math.sqrt(2 * max(checkpoint, 1e-3) * mtbp)
    waste = checkpoint / interval + interval / (2 * mtbp) + restart / mtbp
    return 1 / (1 + waste)


def run(quick: bool = False) -> list[dict]:
    if os.geteuid() != 0:
        raise RuntimeError("needs root and Slurm (it starts a local cluster)")
    steps, mtbp = (600, 12.0) if quick else (1600, 20.0)
    folder = Path(tempfile.mkdtemp(prefix="sp-bench-e2e-"))
    spec = testcluster.ClusterSpec(
        directory=folder / "cluster", standard=1, preemptible=4, port=17950, hooks=True, accounting=True
    )
    state = testcluster.up(spec)
    try:
        with_n = _run_trace(state, folder, steps, mtbp, seed=11, notices=True)
        without = _run_trace(state, folder, steps, mtbp, seed=11, notices=False)
    finally:
        testcluster.down(spec.directory)
    goodput = with_n["work"] / with_n["wall"]
    optimum = young_daly_goodput(with_n["checkpoint_cost"], with_n["restart"], mtbp)
    lost_with = statistics.mean(with_n["lost"]) if with_n["lost"] else 0.0
    lost_without = statistics.mean(without["lost"]) if without["lost"] else 0.0
    rows = [
        {"name": f"goodput, Poisson trace (M={mtbp:g} s, {with_n['preemptions']} preemptions)",
         "value": round(goodput, 3), "unit": "work/wall", "baseline": round(optimum, 3),
         "ratio": round(goodput / optimum, 3), "target": ">= 0.95 of Young/Daly"},
        {"name": "work lost per preemption, with notices", "value": round(lost_with, 2), "unit": "s",
         "baseline": round(lost_without, 2),
         "ratio": round(lost_with / lost_without, 3) if lost_without else None,
         "target": "vs watcher off, same trace (as `slurm-preempt history` counts it)"},
        {"name": "attempts ended by a preemption, with notices", "value": len(with_n["lost"]), "unit": "",
         "baseline": len(without["lost"]), "ratio": None, "target": "watcher off: killed by the removal"},
        {"name": "same result as uninterrupted, both runs", "value": with_n["value"] == without["value"],
         "unit": "", "baseline": None, "ratio": None, "target": "True"},
    ]  # fmt: skip
    for phase, values in with_n["phases"].items():
        if values:
            rows.append({"name": f"drain -> running again: {phase} (median)",
                         "value": round(statistics.median(values), 2), "unit": "s", "baseline": None,
                         "ratio": None, "target": ""})  # fmt: skip
    return rows
