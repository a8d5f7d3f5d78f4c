"""Grow-back on the real local cluster (gloo on CPU), with the cluster watcher running.

A 3-node ``--nodes=2-3 --grow-back`` `srun python` job shrinks to 2 when a node that is not its batch
host is drained (job/shrink.py); that node is removed and comes back; the watcher (``grow_back =
true``) tells the job once, through a grow-back notice; its ranks take a final checkpoint and the
script requeues it; the watcher releases it at once; the next attempt runs on 3 nodes and resumes from
that checkpoint with no step redone. Before that, while a pending 3-node job of a higher priority would
take the nodes a requeue frees, the watcher holds the job back (real squeue priorities). The figures
(node free -> told -> running on 3 -> training again) are printed (pytest -s), never asserted.
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from clusterutil import running_watcher, wait_for
from slurm_preempt import ledger
from slurm_preempt.rehearsal import drill
from test_multinode_cluster import (
    LONG_STEPS,
    SHRINK_GRACE,
    _check_shrunk_in_place,
    _job_log,
    _moment,
    _srun_range_job,
    reference,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch is not installed (pip install torch)"
    ),
]

WINDOW = 30  # the job's --grow-back: once per 30 s at most (and not in its attempt's first 30 s)


@pytest.fixture
def grow_watcher(clean_cluster, tmp_path):
    config = tmp_path / "watch.toml"
    config.write_text("[watch]\ngrow_back = true\ngrow_back_min_window = 10\ngrow_back_every = 1\n")
    extra = ["--config", str(config)]
    with running_watcher(clean_cluster, tmp_path / "watch.log", SHRINK_GRACE, extra) as proc:
        yield proc


def _events(cl, job_id: str, kind: str) -> list[dict]:
    return [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == kind]


def test_a_shrunk_job_grows_back_to_three_nodes_once_a_node_returns(clean_cluster, grow_watcher, tmp_path):
    cl = clean_cluster
    job_id, work, result = _srun_range_job(cl, tmp_path, "grow", LONG_STEPS, ["--grow-back", str(WINDOW)])
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    assert len(first.nodes) == 3
    # Only the node the drill takes may come back idle: the 4th preemptible node is kept out.
    spare = [n.name for n in cl.slurm.nodes() if "preemptible" in n.features and n.name not in first.nodes]
    cl.slurm.drain(spare, "not in this drill")
    wait_for(lambda: list((work / "ckpt").glob("step-*")), 180, what="a periodic checkpoint")
    runner = drill.Drill(cl.slurm, drill.node_ops(cl.slurm, allow_real=False), cl.spec.state_dir, tick=0.2)
    event = runner.start_event([first.nodes[2]], grace=SHRINK_GRACE, pause=1, reason=drill.DEFAULT_REASON)
    runner.run_until(lambda: event.removed_at is not None, timeout=180)
    _check_shrunk_in_place(cl, job_id, event, first.nodes[2])  # before the node is back: no grow yet
    rival = _outranking_rival(cl, job_id, first.partition, work)
    runner.run_until(lambda: event.revived_at is not None, timeout=180)
    assert event.revived_at is not None
    # The node is back and idle, but the rival (3 nodes, a higher priority) would take what a requeue
    # frees: the watcher holds the job back, on the real squeue's priorities, until the rival is gone.
    held = f"job {job_id}: no grow-back while pending job {rival} (priority"
    wait_for(lambda: held in (tmp_path / "watch.log").read_text(), 120, what="the hold-back for the rival")
    assert _events(cl, job_id, "grow_back") == []
    cl.slurm.cancel(rival)
    free_at = time.time()

    (grow,) = wait_for(lambda: _events(cl, job_id, "grow_back"), 120, what="the grow-back")
    assert grow["num_nodes_before"] == 2 and grow["nodes"] == 3 and grow["restart_count"] == 0
    again = wait_for(lambda: _larger(cl, job_id), 180, what="the next attempt on 3 nodes")
    on_three = time.time()
    wait_for(lambda: len(_events(cl, job_id, "resumed_from")) == 2, 180, what="training again")
    # From the moment the node was free for it: back, and the rival cancelled.
    figures = {
        "node_free_to_told": round(_moment(cl, job_id, "grow_back") - free_at, 2),
        "told_to_requeued": round(_moment_last(cl, job_id, "requeued") - _moment(cl, job_id, "grow_back"), 2),
        "node_free_to_running_on_3": round(on_three - free_at, 1),  # 0.2 s polls
        "node_free_to_training_again": round(_moment_last(cl, job_id, "resumed_from") - free_at, 2),
    }
    print(f"\njob {job_id} grew back: {json.dumps(figures)}")
    assert set(again.nodes) >= set(first.nodes[:2]) and len(again.nodes) == 3

    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference(LONG_STEPS) and got["world"] == 3 and got["attempt"] == 2
    # Told once (its window, then it ran at MAX); 0 steps redone: it resumed at its last final checkpoint.
    assert len(_events(cl, job_id, "grow_back")) == 1
    finals = [e for e in _events(cl, job_id, "checkpoint_saved") if e.get("final")]
    (requeued,) = _events(cl, job_id, "requeued")
    resumed = _events(cl, job_id, "resumed_from")
    assert finals[-1]["step"] == requeued["step"] == resumed[-1]["step"], (finals, requeued, resumed)
    assert [e["restart_count"] for e in _events(cl, job_id, "fast_restart")] == [1]  # released at once
    log = _job_log(work, "grow", job_id)
    assert "requeue, not shrink: a grow-back notice" in log, log


def _outranking_rival(cl, job_id: str, partition: str, work) -> str:
    """A 3-node job that cannot start (the job holds 2 nodes, the 4th is drained), its priority set
    above the job's by the admin: pending, it would take the nodes a grow-back's requeue frees."""
    argv = ["sbatch", "--parsable", "--nodes=3", "--constraint=preemptible", f"--partition={partition}",
            f"--output={work}/rival.out", "--wrap", "sleep 600"]  # fmt: skip
    out = cl.slurm.run(argv)
    rival = out.strip().split(";")[0]
    queue = {q.job_id: q for q in cl.slurm.queue(partition)}
    assert queue[job_id].state == "RUNNING" and queue[rival].state == "PENDING", queue
    cl.slurm.update_job(rival, priority=str(queue[job_id].priority + 10))
    rival_entry = next(q for q in cl.slurm.queue(partition) if q.job_id == rival)
    assert rival_entry.priority == queue[job_id].priority + 10, rival_entry  # parsed from real output
    return rival


def _larger(cl, job_id: str):
    job = cl.slurm.job(job_id)
    return job if job is not None and job.running and job.restart_count == 1 and len(job.nodes) == 3 else None


def _moment_last(cl, job_id: str, kind: str) -> float:
    paths = sorted(ledger.job_dir(cl.spec.state_dir, job_id).glob(f"*-{kind}.json"))
    assert paths, f"no {kind} event for job {job_id}"
    return int(paths[-1].name.split("-", 1)[0]) / 1e9
