"""End to end on the real local cluster: generated script + resume library + watcher daemon + drill.

A deterministic job is preempted three times (drain at T+0, removal at T+grace, nodes back after a
pause) with the watcher running; each time it must be told, take a final checkpoint, leave before the
removal, run again within seconds elsewhere, and finally produce exactly the uninterrupted result.
Grace is compressed to a few seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clusterutil import wait_for
from slurm_preempt import drill, ledger

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_loop.py"
SP = str(Path(sys.executable).parent / "slurm-preempt")
STEPS, EVERY = 400, 25
GRACE = 6.0


def _reference(tmp_path: Path) -> int:
    out = tmp_path / "reference.json"
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(tmp_path / "ref"), "--steps", str(STEPS),
         "--every", str(EVERY), "--step-seconds", "0", "--result", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return json.loads(out.read_text())["value"]


@pytest.fixture
def watcher(clean_cluster, tmp_path):
    log = open(tmp_path / "watch.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [SP, "watch", "--cluster", "--interval", "1", "--grace", str(GRACE), "--allow-preemptible-host",
         "--state-dir", str(clean_cluster.spec.state_dir)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    yield proc
    proc.terminate()
    proc.wait(10)
    log.close()


def test_three_preemptions_zero_steps_lost_same_result(clean_cluster, watcher, tmp_path):
    cl = clean_cluster
    expected = _reference(tmp_path)
    work = tmp_path / "job"
    result = work / "result.json"
    script = work / "job.sbatch"
    work.mkdir()
    subprocess.run(
        [SP, "sbatch", "--job-name", "e2e", "--chdir", str(work), "--checkpoint-dir", str(work / "ckpt"),
         "--write", str(script), "--", sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--every",
         str(EVERY), "--step-seconds", "0.05", "--result", str(result)],
        check=True, capture_output=True,
    )  # fmt: skip
    job_id = cl.slurm.submit(str(script))
    runner = drill.Drill(cl.slurm, drill.node_ops(cl.slurm, allow_real=False), cl.spec.state_dir, tick=0.2)
    for _round in range(3):
        cl.wait_state(job_id, "RUNNING", timeout=30)
        # Let it compute and take a periodic checkpoint or two before the provider strikes.
        wait_for(lambda: len(list((work / "ckpt").glob("step-*"))) > 0, 30, what="a checkpoint")
        node = cl.job(job_id).nodes[0]
        event = runner.start_event([node], grace=GRACE, pause=1, reason=drill.DEFAULT_REASON)
        runner.run_until_done(timeout=60)
        watch = event.jobs[job_id]
        assert watch.verdict(event.removed_at).startswith("saved"), watch
        assert watch.running_again_at - watch.left_at < 15  # not Slurm's ~121 s hold
        assert node not in watch.where
    wait_for(result.exists, 120, what="the job's result")
    assert json.loads(result.read_text())["value"] == expected
    # Zero steps lost: every attempt resumed from the final checkpoint its predecessor took on notice.
    events = ledger.events(cl.spec.state_dir, job_id)
    requeued = [e for e in events if e["kind"] == "requeued"]
    resumed = [e for e in events if e["kind"] == "resumed_from"]
    assert len(requeued) == 3 and len(resumed) == 3
    assert [e.get("step") for e in resumed] == [e.get("step") for e in requeued]
