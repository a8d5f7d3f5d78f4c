"""Jobs held because their launch failed, and past MaxBatchRequeue: what Slurm does, what the watcher does.

A cluster of its own (1 standard + 2 preemptible nodes, on SP_TEST_PORT+30) whose prolog fails for the
jobs the test marks: a failed launch, as a node lost while the job starts would give. Every failed
prolog also drains its node, which the test resumes.
"""

from __future__ import annotations

import os

import pytest

from clusterutil import own_cluster, wait_for
from fakeslurm import Clock, FakeSlurm
from hostileusers import MALLORY, as_user, ensure_user
from slurm_preempt import ledger
from slurm_preempt.errors import SlurmError
from slurm_preempt.records import history, texts
from slurm_preempt.slurm import features
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch import launchhold
from slurm_preempt.watch.sentstate import SentState
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.watcher import Watcher, load_sent

PROLOG = """#!/bin/sh
# Fails the launch of jobs the test marked; never anything else.
[ -e "{marks}/fail-$SLURM_JOB_ID" ] && exit 1
exit 0
"""
OPT_IN = "--comment=slurm-preempt:signal=USR1"


@pytest.fixture(scope="module")
def lcluster(tmp_path_factory):
    marks = tmp_path_factory.mktemp("marks")
    prolog = marks / "prolog.sh"
    prolog.write_text(PROLOG.format(marks=marks))
    prolog.chmod(0o755)
    with own_cluster("launch", marks, standard=1, preemptible=2, extra_conf=(f"Prolog={prolog}",)) as handle:
        yield handle


@pytest.fixture
def lc(lcluster):
    yield lcluster
    lcluster.reset()


def _submit_failing(lc) -> str:
    """A job whose launches fail until the test removes its mark."""
    script = lc.workdir / "job.sh"
    script.write_text("#!/bin/sh\necho ran on $SLURMD_NODENAME\n")
    job_id = lc.slurm.submit(
        str(script), ["--hold", "--requeue", "--constraint=preemptible", OPT_IN, f"--chdir={lc.workdir}"]
    )
    (lc.workdir / f"fail-{job_id}").touch()
    lc.slurm.release(job_id)
    return job_id


def _held(lc, job_id: str, reasons) -> Job:
    def held():
        job = lc.job(job_id)
        return job if job and job.state in launchhold.HELD_STATES and job.reason in reasons else None

    job = wait_for(held, 60, what=f"held: {reasons}")
    assert job_id in {j.job_id for j in lc.slurm.jobs(states=launchhold.PENDING_STATES)}  # as the watcher
    return job


def _resume_drained(lc) -> None:
    drained = [n.name for n in lc.slurm.nodes() if n.drain]
    if drained:
        lc.slurm.resume(drained)


def _watcher(lc) -> Watcher:
    return Watcher(Slurm(timeout=20), Settings(), SentState(), lc.spec.state_dir)


@pytest.mark.cluster
def test_failed_launch_holds_the_job_and_the_watcher_moves_and_releases_it(lc):
    job_id = _submit_failing(lc)
    held = _held(lc, job_id, [launchhold.LAUNCH_FAILED])
    assert held.restart_count == 1
    assert any(n.drain and n.reason == "Prolog error" for n in lc.slurm.nodes())  # Slurm drains it
    (lc.workdir / f"fail-{job_id}").unlink()  # standard nodes launch it
    watcher = _watcher(lc)
    wait_for(lambda: watcher.poll_once() and lc.job(job_id).state in ("RUNNING", "COMPLETED"), 30, 0.5)
    done = lc.wait_state(job_id, "COMPLETED", timeout=60)
    assert done.nodes == ("std1",) and done.features == "standard"
    [event] = [e for e in ledger.events(lc.spec.state_dir, job_id) if e["kind"] == "launch_held"]
    assert event["released"] and event["fallback"] == "standard" and not event["limit"]
    text = texts.history_text(history.from_ledger(job_id, lc.spec.state_dir))
    assert "warning:" in text and "launch failed, held: moved to standard, released by the watcher" in text


@pytest.mark.cluster
def test_failed_launches_count_toward_max_batch_requeue_from_23_02(lc):
    """From 23.02 (24.11, 25.11, 26.05) the job is held for good after 5 failed launches (only an
    operator may release it); 22.05 never holds it. The watcher (root here) moves it and releases it."""
    job_id = _submit_failing(lc)
    limit_on = features.has(lc.slurm.version(), features.MAX_BATCH_REQUEUE_SETTING)
    for failure in range(1, 6):
        reasons = [launchhold.LAUNCH_FAILED, *launchhold.LIMIT_REACHED]
        held = _held(lc, job_id, reasons)
        assert held.restart_count == failure
        reached = held.reason in launchhold.LIMIT_REACHED
        assert reached == (limit_on and failure == 5), held
        _resume_drained(lc)
        if not reached:  # what the job's owner would do; the watcher is not running yet
            lc.slurm.release(job_id)
            _start_now(lc, job_id)
    if not limit_on:
        return
    (lc.workdir / f"fail-{job_id}").unlink()
    watcher = _watcher(lc)
    wait_for(lambda: watcher.poll_once() and lc.job(job_id).state in ("RUNNING", "COMPLETED"), 30, 0.5)
    assert lc.wait_state(job_id, "COMPLETED", timeout=60).features == "standard"
    [event] = [e for e in ledger.events(lc.spec.state_dir, job_id) if e["kind"] == "launch_held"]
    assert event["limit"] and event["released"]


def _start_now(lc, job_id: str) -> None:
    def taken():
        try:
            lc.slurm.update_job(job_id, starttime="now")
        except SlurmError:
            return True  # no longer pending: it launched (and maybe failed again)
        job = lc.job(job_id)
        return job is not None and job.reason != "BeginTime"

    wait_for(taken, 30, what="the hold lifted")


# ---------------------------------------------------------------------------------------- decisions
# The watcher's decisions on the in-memory fake (tests/fakeslurm.py); the real thing is above.


def _fake_watcher(tmp_path):
    clock = Clock()
    slurm = FakeSlurm(clock)
    watcher = Watcher(slurm, Settings(interval=1.0), SentState(), tmp_path, clock=clock)
    return slurm, watcher


def test_released_once_per_job_then_left_held(tmp_path, caplog):
    slurm, watcher = _fake_watcher(tmp_path)
    job = slurm.add_job(
        "7", comment=OPT_IN.split("=", 1)[1], reason=launchhold.LAUNCH_FAILED, restart_count=1
    )
    job.features = "preemptible"
    watcher.poll_once()
    assert slurm.called("release") == [{"job_id": "7"}]
    assert {"job_id": "7", "features": "standard"} in slurm.called("update_job")
    assert {"job_id": "7", "starttime": "now"} in slurm.called("update_job")  # moved: no hold needed
    watcher.poll_once()  # the same hold (now BeginTime): only the start time again, no second release
    assert len(slurm.called("release")) == 1
    job.state, job.reason, job.restart_count = "PENDING", launchhold.LAUNCH_FAILED, 2  # failed again
    with caplog.at_level("WARNING"):
        watcher.poll_once()
    assert len(slurm.called("release")) == 1  # left held: it would drain one node after another
    assert any("stays held" in r.getMessage() for r in caplog.records)
    kinds = [(e["kind"], e["released"]) for e in ledger.events(tmp_path, "7")]
    assert kinds == [("launch_held", True), ("launch_held", False)]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_the_owner_deleting_the_launch_held_event_never_gets_a_second_release(tmp_path):
    """Issue 28 item 2: the job runs (the state forgets it: no longer pending), its owner deletes root's
    ``launch_held`` event from their own folder, the job fails to launch again past MaxBatchRequeue, and
    a restarted watcher (state from disk) still leaves it held."""
    clock = Clock()
    slurm = FakeSlurm(clock)
    path = tmp_path / "watcher" / "sent.json"
    watcher = Watcher(slurm, Settings(interval=1.0), SentState(path), tmp_path, clock=clock)
    job = slurm.add_job(
        "17", comment=OPT_IN.split("=", 1)[1], reason=launchhold.LAUNCH_FAILED, restart_count=1
    )
    watcher.poll_once()
    assert len(slurm.called("release")) == 1
    job.state, job.reason = "RUNNING", ""
    watcher.poll_once()  # no longer pending: its restart record is forgotten
    folder = ledger.job_dir(tmp_path, "17")
    uid, gid = ensure_user(MALLORY)
    os.chown(folder, uid, gid)  # the prolog's hand-over: the folder is the job's user's

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # pytest's tmp_path is root's 0700 above it

    def delete_roots_events():
        for name in os.listdir(fd):
            os.unlink(name, dir_fd=fd)

    _pid, status = os.waitpid(as_user(MALLORY, delete_roots_events), 0)
    os.close(fd)
    assert status == 0 and os.listdir(folder) == []
    job.state, job.reason, job.restart_count = "REQUEUE_HOLD", launchhold.LIMIT_REACHED[0], 5
    restarted = Watcher(slurm, Settings(interval=1.0), load_sent(path), tmp_path, clock=clock)
    restarted.poll_once()
    assert len(slurm.called("release")) == 1


def test_past_max_batch_requeue_the_hold_is_found_and_released(tmp_path):
    slurm, watcher = _fake_watcher(tmp_path)
    reason = launchhold.LIMIT_REACHED[0]
    slurm.add_job("8", state="REQUEUE_HOLD", comment=OPT_IN.split("=", 1)[1], reason=reason, restart_count=5)
    watcher.poll_once()
    assert {"states": launchhold.PENDING_STATES} in [
        {"states": c["states"]} for c in slurm.called("jobs") if c["states"]
    ]
    assert slurm.called("release") == [{"job_id": "8"}]
    [event] = ledger.events(tmp_path, "8")
    assert event["limit"] and event["released"] and event["fallback"] == "standard"


def test_jobs_that_did_not_opt_in_are_left_alone(tmp_path):
    slurm, watcher = _fake_watcher(tmp_path)
    slurm.add_job("9", reason=launchhold.LAUNCH_FAILED, restart_count=1)
    watcher.poll_once()
    assert slurm.called("release") == [] and slurm.called("update_job") == []
