"""The preemption drill: verdicts (pure) and one real drill on the local cluster."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from clusterutil import lift_requeue_hold, wait_for
from slurm_preempt import ledger
from slurm_preempt.cli import main
from slurm_preempt.errors import UsageError
from slurm_preempt.rehearsal import drill
from slurm_preempt.slurm.commands import Slurm


def test_verdicts():
    watch = drill.JobWatch("1", ("pre1",), 0, left_at=100.0, running_again_at=104.0, final_checkpoint_at=99.0)
    assert watch.verdict(removed_at=120.0).startswith("saved")
    killed = drill.JobWatch("2", ("pre1",), 0, left_at=120.2, running_again_at=125.0)
    assert killed.verdict(removed_at=120.0).startswith("killed by the removal")
    pending = drill.JobWatch("3", ("pre1",), 0, left_at=120.2)
    assert pending.verdict(removed_at=120.0) == "did not run again (pending)"
    done = drill.JobWatch("4", ("pre1",), 0, ended="COMPLETED")
    assert done.verdict(None) == "finished inside the window"


def test_text_says_each_event_each_job_and_the_summary():
    t0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    saved = drill.JobWatch("7", ("pre1",), 0, notified_at=t0 + 1, final_checkpoint_at=t0 + 5,
                           left_at=t0 + 5.2, requeued_at=t0 + 6, running_again_at=t0 + 9.2,
                           where=("pre3",))  # fmt: skip
    stuck = drill.JobWatch("8", ("pre1",), 0)
    event = drill.DrillEvent(("pre1", "pre2"), t0, grace=20, pause=10, removed_at=t0 + 20, revived_at=t0 + 30)
    event.jobs = {"7": saved, "8": stuck}
    assert drill.drill_text([event]) == (
        "pre1,pre2: drained 2026-05-28T20:26:40Z, removed 2026-05-28T20:27:00Z, back 2026-05-28T20:27:10Z\n"
        "  job 7: notified 2026-05-28T20:26:41Z, final checkpoint 2026-05-28T20:26:45Z, left "
        "2026-05-28T20:26:45Z, requeued 2026-05-28T20:26:46Z, running again 2026-05-28T20:26:49Z on pre3\n"
        "    saved: final checkpoint, left before removal, running again after 4.0 s\n"
        "  job 8: notified -, final checkpoint -, left -, requeued -, running again - on -\n"
        "    still on the node\n"
        "summary: 1 event(s), 2 job(s) hit, 1 saved by the notice, "
        "median 4.0 s from leaving to running again\n"
    )
    assert drill.drill_text([]) == "summary: 0 event(s), 0 job(s) hit, 0 saved by the notice\n"


def test_ledger_fills_notice_and_final_checkpoint(tmp_path):
    ledger.record(tmp_path, "7", "notice_sent", source="watcher")
    ledger.record(tmp_path, "7", "checkpoint_saved", source="job", step=42)
    watch = drill.JobWatch("7", ("pre1",), 0)
    drill._fill_from_ledger(watch, ledger.events(tmp_path, "7"), since=0)
    assert watch.notified_at is not None and watch.final_checkpoint_step == 42


def test_refuses_real_cluster_without_flag(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=prod\n")
    slurm = Slurm(env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
    with pytest.raises(UsageError, match="--real-cluster"):
        drill.node_ops(slurm, allow_real=False)
    assert drill.node_ops(slurm, allow_real=True).local is False


def test_cli_needs_a_target(cluster):
    result = CliRunner().invoke(main, ["drill", "--grace", "1"])
    assert result.exit_code == 2 and "--nodes" in result.output
    result = CliRunner().invoke(main, ["drill", "--random", "--grace", "1"])
    assert result.exit_code == 2 and "--mtbp" in result.output


@pytest.mark.cluster
def test_drill_removes_and_brings_back(clean_cluster):
    script = clean_cluster.workdir / "drill-sleep.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    job_id = clean_cluster.slurm.submit(
        str(script), [f"--chdir={clean_cluster.workdir}", "--requeue", "--constraint=preemptible"]
    )
    node = clean_cluster.wait_state(job_id, "RUNNING").nodes[0]
    ops = drill.node_ops(clean_cluster.slurm, allow_real=False)
    assert ops.local
    runner = drill.Drill(clean_cluster.slurm, ops, tick=0.2)
    event = runner.start_event([node], grace=1, pause=1, reason=drill.DEFAULT_REASON)
    watch = event.jobs[job_id]
    # The job waits out Slurm's requeue hold, so the drill is never "done": run it until the node is
    # back and the job requeued, however long a busy machine takes (the timeout only ends a hung test).
    assert runner.run_until(lambda: bool(event.revived_at and watch.requeued_at), timeout=120)
    assert event.removed_at and event.revived_at and watch.left_at and watch.requeued_at
    assert clean_cluster.job(job_id).restart_count == 1
    # Node back in service; the requeued job waits out Slurm's BeginTime unless a watcher skips it.
    assert next(iter(clean_cluster.slurm.nodes([node]))).available
    wait_for(lambda: lift_requeue_hold(clean_cluster.slurm, job_id), 30, what="the hold lifted")
    again = clean_cluster.wait_state(job_id, "RUNNING", timeout=20)
    assert again.restart_count == 1


def test_told_phases_split_a_told_jobs_way_from_the_drain_to_training_again():
    event = drill.DrillEvent(nodes=("pre1",), drain_at=100.0, grace=30, pause=5)
    watch = drill.JobWatch("7", ("pre1",), 0, notified_at=100.5, final_checkpoint_at=100.75, left_at=101.0,
                           running_again_at=104.0)  # fmt: skip
    assert drill.told_phases(event, watch, [90.0, 110.0]) == {
        "notice": 0.5, "checkpoint": 0.25, "leave": 0.25, "wait": 3.0, "start": 6.0,
    }  # fmt: skip
    assert drill.told_phases(event, watch, [])["start"] == 0.0  # no resumed_from yet
    watch.left_at = None  # killed by the removal: never told in time
    assert drill.told_phases(event, watch, [110.0]) is None
