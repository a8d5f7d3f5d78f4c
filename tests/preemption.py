"""One preemption of a deterministic generated job, for the end-to-end tests (tests/test_e2e.py, and the
watcher daemon reading through pyslurm in tests/test_pyslurm_cluster.py): the job, its uninterrupted
result, and one drill round (drain at T+0, removal at T+grace, node back after a pause) with the checks
every round must pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clusterutil import ClusterHandle, wait_for
from slurm_preempt import ledger
from slurm_preempt.rehearsal import drill

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_loop.py"
STEPS, EVERY = 400, 25
GRACE = 6.0


def reference(tmp_path: Path, steps: int = STEPS) -> int:
    """The job's result when nothing interrupts it."""
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "reference.json"
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(tmp_path / "ref"), "--steps", str(steps),
         "--every", str(EVERY), "--step-seconds", "0", "--result", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return json.loads(out.read_text())["value"]


def train(result: Path, step_seconds: float = 0.05) -> list[str]:
    """The deterministic job: examples/train_loop.py for STEPS steps, a checkpoint every EVERY."""
    return [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--every", str(EVERY), "--step-seconds",
            str(step_seconds), "--result", str(result)]  # fmt: skip


def drill_runner(cl: ClusterHandle) -> drill.Drill:
    return drill.Drill(cl.slurm, drill.node_ops(cl.slurm, allow_real=False), cl.spec.state_dir, tick=0.2)


def preempt_once(cl: ClusterHandle, runner: drill.Drill, job_id: str, work: Path) -> drill.JobWatch:
    """Once the running job has a periodic checkpoint, its node is drained and removed GRACE s later;
    the job must be told, take a final checkpoint, leave before the removal and run again elsewhere
    within seconds (the watcher's fast restart, not Slurm's ~121 s hold)."""
    cl.wait_state(job_id, "RUNNING", timeout=30)
    # Let it compute and take a periodic checkpoint or two before the provider strikes.
    wait_for(lambda: len(list((work / "ckpt").glob("step-*"))) > 0, 30, what="a checkpoint")
    node = cl.job(job_id).nodes[0]
    event = runner.start_event([node], grace=GRACE, pause=1, reason=drill.DEFAULT_REASON)
    runner.run_until_done(timeout=60)
    watch = event.jobs[job_id]
    assert watch.verdict(event.removed_at).startswith("saved"), watch
    assert watch.running_again_at - watch.left_at < 60  # not Slurm's ~121 s hold (~3 s when idle)
    assert node not in watch.where
    return watch


def resumed_where_it_left(state_dir: Path, job_id: str, preemptions: int) -> None:
    """Zero steps lost: every attempt resumed from the final checkpoint its predecessor took on notice."""
    events = ledger.events(state_dir, job_id)
    requeued = [e for e in events if e["kind"] == "requeued"]
    resumed = [e for e in events if e["kind"] == "resumed_from"]
    assert len(requeued) == preemptions and len(resumed) == preemptions, events
    assert [e.get("step") for e in resumed] == [e.get("step") for e in requeued]
