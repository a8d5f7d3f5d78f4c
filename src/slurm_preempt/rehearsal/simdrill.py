"""``simulate`` against a measured drill: one job under Poisson preemptions on a local cluster, what it
measured, and the simulator's prediction from those figures (``bench/bench_simulate.py`` and
``tests/test_simulate_cluster.py`` both run it; one copy).

On a local cluster with the hooks installed, the cluster watcher running, a deterministic job
(``examples/train_loop.py``, one node, generated with ``slurm-preempt sbatch``) computes ``steps``
steps while its node is preempted (drained, removed ``GRACE`` seconds later, brought back a second
after) at Poisson times, mean ``mtbp`` seconds of the job's running time: a draw that falls while the
job waits is drawn again, as the simulator's preemptions strike only a running attempt.

Measured, from the ledger and the drill's own observations: the compute per step and the checkpoint
cost (consecutive periodic saves of one attempt), the drain -> running-again phases (notice, final
checkpoint, leaving, waiting, program start), the completion time (first running -> result written)
and the node time held (the completion time less the waits in the queue). The simulator is given
those figures (the work, the interval and checkpoint cost, the drill's own notice latency, its start
as the restart, its leaving and waiting as the unpaid wait, its first program start added to every
run), so that a loaded machine's slowness is in the prediction too, and the measured figures are
compared with its runs that had the drill's own count of preemptions (the drill is one draw of a
Poisson count; that comparison takes the luck out).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_preempt import ledger
from slurm_preempt.errors import ClusterError
from slurm_preempt.notice import from_text
from slurm_preempt.rehearsal import drill
from slurm_preempt.rehearsal.clusterspec import ClusterState
from slurm_preempt.simulate import engine
from slurm_preempt.simulate.spec import HOUR, Field, JobSpec
from slurm_preempt.simulate.strategies import Strategy

GRACE, STEP_SECONDS, EVERY = 6.0, 0.05, 100
AGREEMENT = 0.15  # issue 27: the prediction matches the drill within 15%
SP = str(Path(sys.executable).parent / "slurm-preempt")


def run_drill(
    state: ClusterState,
    work: Path,
    example: Path,
    steps: int,
    seed: int,
    mtbp: float,
    jump: tuple[float, float] | None = None,
    give_up: float = 1800.0,
) -> dict[str, Any]:
    """The job under Poisson preemptions of its node, the watcher telling it; what was measured.
    ``jump``: (seconds after the job first runs, factor): from then on the rate is that many times.
    ``give_up``: seconds without the job running or finishing after which the drill is called hung."""
    env = {**os.environ, **state.env()}
    slurm = state.slurm(timeout=30)
    subprocess.run(
        [SP, "sbatch", "--job-name", "validate", "--chdir", str(work), "--checkpoint-dir", str(work / "ckpt"),
         "--write", str(work / "job.sbatch"), "--", sys.executable, str(example), "--steps", str(steps),
         "--every", str(EVERY), "--step-seconds", str(STEP_SECONDS), "--result", str(work / "result.json")],
        check=True, capture_output=True, env=env, timeout=60,
    )  # fmt: skip
    watcher = subprocess.Popen(
        [SP, "watch", "--cluster", "--interval", "1", "--grace", str(GRACE), "--allow-preemptible-host"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        job_id = slurm.submit(str(work / "job.sbatch"))
        _until(lambda: (job := slurm.job(job_id)) is not None and job.running, give_up, "the job runs")
        runner = drill.Drill(slurm, drill.node_ops(slurm, allow_real=False), state.spec.state_dir, tick=0.1)
        began = _preempt_until_done(slurm, runner, job_id, work / "result.json", seed, mtbp, jump, give_up)
        wall = time.time() - began
        runner.run_until_done(timeout=60)
    finally:
        watcher.terminate()
        watcher.wait(10)
    return measured(state.spec.state_dir, job_id, runner, began, wall, steps)


def _until(reached, give_up: float, what: str) -> None:
    deadline = time.monotonic() + give_up
    while not reached():
        if time.monotonic() > deadline:
            raise ClusterError(f"simulate drill: hung waiting for {what} ({give_up:.0f} s)")
        time.sleep(0.1)


def _preempt_until_done(
    slurm, runner: drill.Drill, job_id: str, result: Path, seed: int, mtbp: float, jump, give_up: float
) -> float:
    """Drain the job's node at Poisson times of its running time until ``result`` is written; returns
    when the job first ran (epoch seconds)."""
    began = last = progress = time.time()
    rng = random.Random(seed)
    exposure, next_at, rate = 0.0, rng.expovariate(1 / mtbp), 1 / mtbp
    while not result.exists():
        now = time.time()
        if jump and rate == 1 / mtbp and now - began >= jump[0]:  # memoryless: draw again
            rate = jump[1] / mtbp
            exposure, next_at = 0.0, rng.expovariate(rate)
        job = slurm.job(job_id)
        busy = {n for e in runner.events if e.removed_at is None for n in e.nodes}
        running = bool(job and job.running and not busy & set(job.nodes))
        exposure += now - last if running else 0.0  # Poisson in the job's running time
        progress = now if running else progress
        if now - progress > give_up:
            raise ClusterError(f"simulate drill: job {job_id} not running for {give_up:.0f} s")
        if running and exposure >= next_at and job:
            runner.start_event(job.nodes, GRACE, 1, drill.DEFAULT_REASON)
            exposure, next_at = 0.0, rng.expovariate(rate)
        runner.step(now)
        last = now
        time.sleep(0.1)
    return began


def _times(events: list[dict], kind: str, **match) -> list[tuple[float, dict]]:
    return [
        (from_text(e["time"]).timestamp(), e)
        for e in events
        if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())
    ]


def measured(
    state_dir: Path, job_id: str, runner: drill.Drill, began: float, wall: float, steps: int
) -> dict[str, Any]:
    """What the drill measured, from the job's ledger and the drill's observations (``began``: when
    the job was first seen running)."""
    events = ledger.events(state_dir, job_id)
    saves = _times(events, "checkpoint_saved", final=False)
    # Two periodic saves EVERY steps apart can straddle a preemption (700, final 764, resumed, 800):
    # only a pair with no final save or resume between them is one segment of computing.
    breaks = [t for t, _e in _times(events, "checkpoint_saved", final=True) + _times(events, "resumed_from")]
    segments = [
        b[0] - a[0]
        for a, b in zip(saves, saves[1:], strict=False)
        if b[1]["step"] - a[1]["step"] == EVERY and not any(a[0] <= t <= b[0] for t in breaks)
    ]
    checkpoint = statistics.median(e.get("seconds") or 0.0 for _t, e in saves)
    # The mean, not the median: the work is the sum of the steps, and a loaded machine's slow
    # segments are part of it (the median read the work ~0.4% short, which showed as overhead).
    per_step = (statistics.mean(segments) - checkpoint) / EVERY
    # The program's own first start (running -> computing), which the simulator's first attempt,
    # computing at once as in Daly's model, does not have: added to its prediction.
    first_at, first = saves[0]
    first_start = max(0.0, first_at - began - first["step"] * per_step - checkpoint)
    starts = [t for t, _e in _times(events, "resumed_from")]
    phases: dict[str, list[float]] = {name: [] for name in drill.PHASES}
    for event, watch in ((e, w) for e in runner.events for w in e.jobs.values()):
        for name, seconds in (drill.told_phases(event, watch, starts) or {}).items():
            phases[name].append(seconds)
    return {
        "job_id": job_id,
        "wall": wall,
        "held": wall - sum(phases["wait"]),
        "preemptions": len(runner.events),
        "told": len(phases["wait"]),
        "work": steps * per_step,
        "per_step": per_step,
        "interval": EVERY * per_step,
        "checkpoint": checkpoint,
        "first_start": first_start,
        "phases": phases,
    }


def predicted(
    measured: dict[str, Any], mtbp: float, jump: tuple[float, float] | None, runs: int, seed: int = 1
) -> dict[str, Any]:
    """The simulator, given what the drill measured: its spread over all runs and over the runs with
    the drill's count of preemptions."""
    phases = measured["phases"]
    start = phases["start"] or [0.0]
    spec = JobSpec(
        work_hours=measured["work"] / HOUR,
        nodes=1,
        checkpoint_seconds=measured["checkpoint"],
        restart_seconds=(min(start), max(start)),
        notice_seconds=GRACE,
        notice_latency_seconds=statistics.median(phases["notice"]) if phases["notice"] else 0.0,
        field=Field(
            mtbp_hours=mtbp / HOUR,
            unannounced=0.0,
            jump_hour=jump[0] / HOUR if jump else None,
            jump_factor=jump[1] if jump else 1.0,
        ),
    )
    # Unpaid in the model: from the final checkpoint to running again (leaving, then the queue).
    unpaid = [leave + wait for leave, wait in zip(phases["leave"], phases["wait"], strict=True)]
    strategy = Strategy(
        "toolkit", "slurm-preempt", measured["interval"], notices=True,
        requeue_wait=statistics.median(unpaid) if unpaid else 0.0,
    )  # fmt: skip
    sims = engine.simulate(spec, strategy, runs, seed)
    same = sims.preemptions == measured["preemptions"]
    wall, held = sims.now + measured["first_start"], sims.held_spot + measured["first_start"]
    return {
        "wall": spread(wall),
        "held": spread(held),
        "preemptions": float(sims.preemptions.mean()),
        "wall_same_count": spread(wall[same]) if same.any() else None,
        "overhead_same_count": spread(wall[same] - spec.work_seconds) if same.any() else None,
        "held_same_count": spread(held[same]) if same.any() else None,
        "runs_same_count": int(same.sum()),
    }


def spread(values) -> dict[str, float]:
    ordered = sorted(float(v) for v in values)
    at = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)]  # noqa: E731
    return {"median": at(0.5), "p5": at(0.05), "p95": at(0.95)}
