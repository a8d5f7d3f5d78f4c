"""The deadline drill on a real local cluster with the hooks installed (their ``attempt_start`` is the
first start the rule measures from): a job that reports slow progress against a near
``fallback-deadline`` is moved once to standard nodes at its requeue and runs there; one with a loose
deadline comes back on preemptible nodes, never moved. Seconds each (``watch/deadline.py``).

The cost drill on the same cluster: a job that never checkpoints, with ``fallback-cost=0``, in a pool
the watcher sees drained every few seconds (its own published rate) is left on preemptible nodes
after its first preemption and moved to standard nodes at its second (``watch/cost.py``)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone

import pytest

from clusterutil import ClusterHandle, own_cluster, wait_for
from slurm_preempt import ledger, optin
from slurm_preempt.notice import utcnow
from slurm_preempt.records.prices import Prices
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.watch.actions import NO_PRICES
from slurm_preempt.watch.rate import FILE_NAME
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


def _preempt_once(
    cl: ClusterHandle, job_id: str, progress: int = 1, prices: Prices = NO_PRICES
) -> tuple[str, object]:
    """``progress`` reports made, the node drained and the job requeued; the watcher (the cluster
    daemon's, publishing the pool's rate; ``prices``: its [report]'s) polls until it runs again."""
    wait_for(lambda: _kinds(cl, job_id).count("progress") == progress, 60, what="the job's progress")
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    watcher = Watcher(Slurm(timeout=20), Settings(grace=20.0), SentState(), cl.spec.state_dir)
    watcher.ctx.prices = prices
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


LOOP = "#!/bin/bash\nwhile true; do sleep 0.2; done\n"
DISCOUNT = Prices(discount=0.2)  # [report] preemptible_discount = 0.2: preemptible at 80% of on-demand


def _ran(cl: ClusterHandle, job_id: str, seconds: float) -> None:
    """Wait until the job has been running ``seconds`` (work it will lose: it never checkpoints)."""

    def long_enough():
        job = cl.job(job_id)
        started = job and job.state == "RUNNING" and job.start_time
        return started and (utcnow() - started).total_seconds() >= seconds

    wait_for(long_enough, 60, 0.5, what=f"job {job_id} running {seconds:g} s")


def test_a_job_dearer_than_on_demand_is_moved_at_its_second_preemption(dcluster):
    """Each attempt loses all it did (no checkpoint); the watcher's rate counts the two drains it saw
    over its own few seconds of life: the overhead times the rate leaves a share of kept work under 0.8,
    and the move comes at the second preemption, never the first (one says little)."""
    cl = dcluster
    (cl.spec.state_dir / FILE_NAME).unlink(missing_ok=True)  # the rate of this test's drains alone
    script = cl.workdir / "cost.sh"
    script.write_text(LOOP)
    script.chmod(0o755)
    wish = optin.OptIn(opted_in=True, signal=None, fallback_cost=0)
    extra = [f"--chdir={cl.workdir}", "--requeue", "--output=/dev/null", "--constraint=preemptible"]
    job_id = cl.slurm.submit(str(script), [*extra, f"--comment={wish.to_comment()}"])
    try:
        _ran(cl, job_id, 15)
        _node, first = _preempt_once(cl, job_id, progress=0, prices=DISCOUNT)
        assert first.features == "preemptible" and "fallback" not in _kinds(cl, job_id)
        _ran(cl, job_id, 3)
        _node, second = _preempt_once(cl, job_id, progress=0, prices=DISCOUNT)
        assert second.features == "standard" and second.nodes[0].startswith("std"), second
        (moved,) = [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == "fallback"]
        assert "fallback-cost=0%" in moved["why"] and "over 2 preemptions" in moved["why"]
        print(f"job {job_id}: {moved['why']}")
    finally:
        cl.slurm.cancel(job_id)
