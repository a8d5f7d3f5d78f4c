"""End to end on the real local cluster: generated script + resume library + watcher daemon + drill.

A deterministic job is preempted six times (drain at T+0, removal at T+grace, nodes back after a pause)
with the watcher running, more than MaxBatchRequeue (5), which preemptions never count toward; each
time it must be told, take a final checkpoint, leave before the removal, run again within seconds
elsewhere, and finally produce exactly the uninterrupted result. Grace is compressed to a few seconds.
"""

from __future__ import annotations

import json
import sys

import pytest

from clusterutil import lift_requeue_hold, running_watcher, submit_generated, wait_for
from preemption import EXAMPLE, GRACE, drill_runner, preempt_once, reference, resumed_where_it_left, train
from slurm_preempt import CheckpointStore, ledger
from slurm_preempt.rehearsal import drill

pytestmark = pytest.mark.cluster

PREEMPTIONS = 6  # more than MaxBatchRequeue's default 5


@pytest.fixture
def watcher(clean_cluster, tmp_path):
    with running_watcher(clean_cluster, tmp_path / "watch.log", GRACE) as proc:
        yield proc


def test_six_preemptions_zero_steps_lost_same_result(clean_cluster, watcher, tmp_path):
    cl = clean_cluster
    expected = reference(tmp_path)
    work = tmp_path / "job"
    result = work / "result.json"
    # 0.2 s a step: six preemptions (~10 s each) come before the 80 s of work is done.
    job_id = submit_generated(cl, work, ["--job-name", "e2e"], train(result, step_seconds=0.2))
    runner = drill_runner(cl)
    for _round in range(PREEMPTIONS):
        preempt_once(cl, runner, job_id, work)
    wait_for(result.exists, 120, what="the job's result")
    assert json.loads(result.read_text())["value"] == expected
    resumed_where_it_left(cl.spec.state_dir, job_id, PREEMPTIONS)


SWEEP = """import os, runpy, sys
task = os.environ["SLURM_ARRAY_TASK_ID"]
sys.argv = [{example!r}, "--steps", str(120 + 20 * int(task)), "--every", "10", "--step-seconds", "0.05",
            "--result", f"{work}/result-{{task}}.json"]
runpy.run_path({example!r}, run_name="__main__")  # exits (SystemExit) when it requeues itself
with open("{work}/completions", "a") as out:
    out.write(task + "\\n")
"""


def test_sweep_survives_random_preemptions_each_task_completes_once(clean_cluster, watcher, tmp_path):
    cl = clean_cluster
    work = tmp_path / "sweep"
    sweep = tmp_path / "sweep.py"
    sweep.write_text(SWEEP.format(example=str(EXAMPLE), work=work))
    options = ["--job-name", "sweep", "--array", "0-5", "--cpus-per-task", "8"]
    array_id = submit_generated(cl, work, options, [sys.executable, str(sweep)])

    def started():
        tasks = [j for j in cl.slurm.jobs() if j.array_job_id == array_id and j.running]
        return len(tasks) >= 4

    wait_for(started, 60, what="the sweep running")
    preemptible = [n.name for n in cl.slurm.nodes() if n.has_feature("preemptible")]
    runner = drill_runner(cl)
    events = runner.random(preemptible, mtbp=6, duration=15, grace=4, pause=1, correlated=1, seed=7)
    hit = [w for e in events for w in e.jobs.values()]
    assert hit, "the random drill preempted no task"
    verdicts = [w.verdict(e.removed_at) for e in events for w in e.jobs.values()]
    # A task may also finish inside the window (it completes before it needs to leave).
    assert all(v.startswith(("saved", "finished inside")) for v in verdicts), verdicts

    def finished():
        return not [j for j in cl.slurm.jobs() if j.array_job_id == array_id and j.state != "COMPLETED"]

    wait_for(finished, 180, interval=1, what="every task finished")
    assert sorted((work / "completions").read_text().split()) == [str(t) for t in range(6)]
    for task in range(6):
        got = json.loads((work / f"result-{task}.json").read_text())
        assert got["value"] == reference(tmp_path / f"ref-{task}", steps=120 + 20 * task)


def test_elastic_job_comes_back_on_fewer_nodes(clean_cluster, watcher, tmp_path):
    """A --nodes=1-2 job starts on two nodes; after a preemption only one is free: it carries on there
    from its final checkpoint, and says the node count changed."""
    cl = clean_cluster
    expected = reference(tmp_path / "ref")
    work = tmp_path / "elastic"
    result = work / "result.json"
    job_id = submit_generated(cl, work, ["--job-name", "elastic", "--nodes", "1-2"], train(result))
    first = cl.wait_state(job_id, "RUNNING", timeout=30)
    assert len(first.nodes) == 2
    preemptible = [n.name for n in cl.slurm.nodes() if n.has_feature("preemptible")]
    others = [n for n in preemptible if n not in first.nodes]
    cl.slurm.drain(others, "maint: keep this test's capacity short")  # only the job's own nodes left
    wait_for(lambda: len(list((work / "ckpt").glob("step-*"))) > 0, 30, what="a checkpoint")
    runner = drill_runner(cl)
    event = runner.start_event([first.nodes[0]], grace=GRACE, pause=1, reason=drill.DEFAULT_REASON)
    runner.run_until_done(timeout=60)
    watch = event.jobs[job_id]
    assert watch.verdict(event.removed_at).startswith("saved"), watch
    assert watch.where == (first.nodes[1],)  # one node now
    cl.slurm.resume(others)
    wait_for(result.exists, 120, what="the job's result")
    assert json.loads(result.read_text())["value"] == expected
    (resumed,) = [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == "resumed_from"]
    assert resumed["nodes"] == 1 and resumed["previous_nodes"] == 2


def test_without_watcher_at_most_one_checkpoint_interval_lost(clean_cluster, tmp_path):
    """No watcher, no notice: the removal kills the job, which loses at most the work since its last
    periodic checkpoint (one interval), resumes from that checkpoint and still ends with the same result."""
    cl = clean_cluster
    expected = reference(tmp_path / "ref")
    work = tmp_path / "nowatch"
    result = work / "result.json"
    job_id = submit_generated(cl, work, ["--job-name", "nowatch"], train(result))
    node = cl.wait_state(job_id, "RUNNING", timeout=30).nodes[0]
    wait_for(lambda: len(list((work / "ckpt").glob("step-*"))) > 0, 30, what="a checkpoint")
    runner = drill_runner(cl)
    # The node stays away for the whole test (a removed machine does not come back in seconds); the
    # cluster's reset brings it back afterwards.
    event = runner.start_event([node], grace=2, pause=3600, reason=drill.DEFAULT_REASON)
    watch = event.jobs[job_id]
    # Nobody lifts the requeue hold here, so the drill is never "done": run it until the job has left
    # (the timeout only ends a hung test).
    assert runner.run_until(lambda: bool(watch.left_at), timeout=120)
    assert watch.left_at >= event.removed_at  # killed by the removal: nobody told it
    saved = ledger.events(cl.spec.state_dir, job_id)
    last_step = max(e["step"] for e in saved if e["kind"] == "checkpoint_saved")
    # The kill may land between a checkpoint becoming valid and its ledger line: the newest valid one on
    # disk is what the job must resume from, and it is never older than the newest the ledger names.
    newest = CheckpointStore(work / "ckpt").latest()
    assert newest is not None and newest.step >= last_step
    # Lifted as the watcher does, while the node the job left is still down: on 25.11 and 26.05 the
    # node's return delivers the kill of the attempt that failed there, which also ends a new attempt
    # just launched there ("CANCELLED ... DUE TO NODE FAILURE", not requeued: the job never finished).
    wait_for(lambda: lift_requeue_hold(cl.slurm, job_id), 30, what="the hold lifted")
    assert not event.revived_at
    wait_for(result.exists, 120, what="the job's result")
    assert json.loads(result.read_text())["value"] == expected
    events = ledger.events(cl.spec.state_dir, job_id)
    resumes = [e for e in events if e["kind"] == "resumed_from"]
    # Resumed from the newest periodic checkpoint: checkpoints come every EVERY steps, so the steps it
    # had run past it when it was killed (and now redoes) are fewer than one interval. (A launch that
    # fails on the node just revived makes Slurm start it once more: that attempt resumes too, never
    # from an older checkpoint.)
    assert resumes and resumes[0]["step"] == newest.step, events
    assert all(e["step"] >= newest.step for e in resumes), events
