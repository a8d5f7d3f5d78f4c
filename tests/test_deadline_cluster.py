"""The deadline drill on a real local cluster with the hooks installed (their ``attempt_start`` is the
first start the rule measures from): a job that reports slow progress against a near
``fallback-deadline`` is moved once to standard nodes at its requeue and runs there; one with a loose
deadline comes back on preemptible nodes, never moved. Seconds each (``watch/deadline.py``)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone

import pytest

from clusterutil import ClusterHandle, own_cluster, wait_for
from slurm_preempt import ledger, optin
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.watch.sentstate import SentState
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.watcher import Watcher

pytestmark = pytest.mark.cluster
REASON = "TogetherPreemptionNotified: deadline drill"
# Reports DONE of 1000 steps 13 s after it starts (past a tenth of a 2-minute deadline), then waits.
SCRIPT = """#!/bin/bash
sleep 13
{python} -m slurm_preempt resume progress {done} 1000
while true; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def dcluster():
    with own_cluster("deadline", standard=1, preemptible=2, cpus=8, hooks=True) as handle:
        yield handle


def _submit(cl: ClusterHandle, done: int, deadline: datetime) -> str:
    script = cl.workdir / f"deadline-{done}.sh"
    script.write_text(SCRIPT.format(python=sys.executable, done=done))
    script.chmod(0o755)
    wish = optin.OptIn(opted_in=True, signal=None, fallback_deadline=deadline)
    extra = [f"--chdir={cl.workdir}", "--requeue", "--output=/dev/null", "--constraint=preemptible"]
    return cl.slurm.submit(str(script), [*extra, f"--comment={wish.to_comment()}"])


def _preempt_once(cl: ClusterHandle, job_id: str) -> tuple[str, object]:
    """Progress reported, the node drained and the job requeued; the watcher polls until it runs again."""
    wait_for(lambda: _kinds(cl, job_id).count("progress") == 1, 60, what="the job's progress")
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    watcher = Watcher(Slurm(timeout=20), Settings(grace=20.0), SentState(), cl.spec.state_dir)
    cl.slurm.drain([node], REASON)
    watcher.poll_once()
    cl.slurm.requeue(job_id)
    wait_for(lambda: cl.job(job_id).reason == "BeginTime", 30, what="requeued, waiting BeginTime")

    def polled_and_running():
        watcher.poll_once()
        job = cl.job(job_id)
        return job if job.state == "RUNNING" else None

    try:
        return node, wait_for(polled_and_running, 40, interval=0.5, what="running again")
    finally:
        cl.slurm.resume([node])


def _kinds(cl: ClusterHandle, job_id: str) -> list[str]:
    return [e["kind"] for e in ledger.events(cl.spec.state_dir, job_id)]


def test_a_job_behind_its_deadline_is_moved_once_to_standard_nodes(dcluster):
    cl = dcluster
    job_id = _submit(cl, 10, datetime.now(timezone.utc) + timedelta(minutes=2))  # 10 of 1000 in 13 s
    try:
        node, job = _preempt_once(cl, job_id)
        assert job.features == "standard" and job.nodes[0].startswith("std"), (node, job)
        (moved,) = [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == "fallback"]
        assert "fallback-deadline" in moved["why"] and moved["after"] == "standard"
        print(f"job {job_id}: {moved['why']}")
    finally:
        cl.slurm.cancel(job_id)


def test_a_job_with_a_loose_deadline_is_never_moved(dcluster):
    cl = dcluster
    job_id = _submit(cl, 500, datetime.now(timezone.utc) + timedelta(days=10))
    try:
        _node, job = _preempt_once(cl, job_id)
        assert job.features == "preemptible" and job.nodes[0].startswith("pre"), job
        assert "fallback" not in _kinds(cl, job_id)
    finally:
        cl.slurm.cancel(job_id)
