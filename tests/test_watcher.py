"""The drain watcher on the real local cluster: tell, signal, restart fast, fall back; survive restarts."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from clusterutil import wait_for, wait_signal_age
from slurm_preempt import ledger
from slurm_preempt.notice import notice_path, read_notice
from slurm_preempt.optin import OptIn
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch import actions, sentstate, tell
from slurm_preempt.watch.loop import run
from slurm_preempt.watch.outbox import Outbox
from slurm_preempt.watch.sentstate import NodeEvent, SentState
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.watcher import Watcher, state_path

OPTED = "slurm-preempt:signal=USR1"
REASON = "TogetherPreemptionNotified: watcher test"
NOW = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)

# A job that traps USR1: records it, writes a "final checkpoint", requeues itself and leaves.
REQUEUE_SCRIPT = """#!/bin/bash
REC={work}/rec-$SLURM_JOB_ID
notice() {{
  echo "usr1 ${{SLURM_RESTART_COUNT:-0}} $SLURMD_NODENAME" >> $REC
  echo "final checkpoint" > {work}/ckpt-$SLURM_JOB_ID
  scontrol requeue $SLURM_JOB_ID
  exit 0
}}
trap notice USR1
echo "start ${{SLURM_RESTART_COUNT:-0}} $SLURMD_NODENAME" >> $REC
{extra}
while true; do sleep 0.1; done
"""
# A job that only records the signal and goes on.
RECORD_SCRIPT = """#!/bin/bash
REC={work}/rec-$SLURM_JOB_ID
trap 'echo "usr1 ${{SLURM_RESTART_COUNT:-0}} $SLURMD_NODENAME" >> $REC' USR1
echo "start ${{SLURM_RESTART_COUNT:-0}} $SLURMD_NODENAME" >> $REC
while true; do sleep 0.1; done
"""
PLAIN_SCRIPT = "#!/bin/bash\nsleep 600\n"


def _script(cluster, name, text, extra=""):
    path = cluster.workdir / name
    path.write_text(text.format(work=cluster.workdir, extra=extra))
    return str(path)


def _submit(cluster, script, comment=OPTED, *args):
    extra = [f"--chdir={cluster.workdir}", "--requeue", "--output=/dev/null", *args]
    if comment:
        extra.append(f"--comment={comment}")
    return cluster.slurm.submit(script, extra)


def _records(cluster, job_id) -> list[str]:
    path = cluster.workdir / f"rec-{job_id}"
    return path.read_text().splitlines() if path.exists() else []


def _kinds(state_dir, job_id) -> list[str]:
    return [e["kind"] for e in ledger.events(state_dir, job_id)]


def _watcher(cluster, tmp_path=None, **settings) -> Watcher:
    state_dir = cluster.spec.state_dir
    path = state_path(tmp_path, None) if tmp_path else None
    values = {"grace": 20.0, "interval": 1.0, "exclude_reasons": (r"^maint",), **settings}
    sent = sentstate.load(path) if path else SentState()
    return Watcher(Slurm(timeout=20), Settings(**values), sent, state_dir)


def _ready(cluster, job_id):
    """Running, and its batch shell past `trap` (the "start" line comes after it). Slurm says RUNNING
    before the script has run a line: a USR1 sent then kills the shell (the signal's default action)."""
    job = cluster.wait_state(job_id, "RUNNING")
    started = f"start {job.restart_count} "
    wait_for(lambda: any(r.startswith(started) for r in _records(cluster, job_id)), 30, what="the trap")
    return wait_signal_age(cluster.slurm, job_id)  # signalled at the first poll (else at a later one)


def _drain(cluster, nodes, reason=REASON):
    cluster.slurm.drain(nodes, reason)


# ---------------------------------------------------------------------------------------- pure parts


def test_sent_state_round_trip_and_forget(tmp_path):
    path = tmp_path / "w" / "sent.json"
    state = SentState(path=path)
    state.open_event(NodeEvent("pre1", NOW, "r", "slurm", 20.0))
    state.mark_told("7", "pre1", "notice", NOW, "pre1@x")
    state.mark_told("8", "pre2", "notice", NOW, "pre2@x")
    state.record_fast_restart("7", 1)
    state.save()
    again = sentstate.load(path)
    assert again.done("7", "pre1", "notice") and not again.done("7", "pre1", "signal")
    assert again.events["pre1"].drain_time == NOW
    again.forget_node("pre1")
    assert not again.done("7", "pre1", "notice") and again.done("8", "pre2", "notice")
    again.forget_jobs(keep=set())
    assert again.restarts == {}


def test_enforce_and_fallback_rules():
    event = NodeEvent("pre1", NOW, "r", "slurm", 60.0)
    assert not actions.enforce_due(event, 10, NOW + timedelta(seconds=49))
    assert actions.enforce_due(event, 10, NOW + timedelta(seconds=50))
    wish = OptIn(opted_in=True, signal="USR1", fallback_after=2, fallback_pending=600)
    job = Job("9", "PENDING", "BeginTime", restart_count=2, submit_time=NOW, features="preemptible")
    assert "preempted 2 times" in actions._fallback_why(job, wish, NOW)
    young = Job("9", "PENDING", "Resources", restart_count=0, submit_time=NOW, features="preemptible")
    assert actions._fallback_why(young, wish, NOW + timedelta(seconds=10)) is None
    assert "pending 600 s" in actions._fallback_why(young, wish, NOW + timedelta(seconds=600))


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in list(caplog.records) if r.name.startswith("slurm_preempt")]


def test_dead_controller_is_logged_and_retried(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n")
    slurm = Slurm(env={**os.environ, "SLURM_CONF": str(conf)}, timeout=3)
    watcher = Watcher(slurm, Settings(interval=0.1, max_backoff=0.3), SentState(), tmp_path)
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(watcher,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    wait_for(lambda: len(_lines(caplog)) >= 2, 60, what="two logged failures")
    assert thread.is_alive() and all("retry" in line for line in _lines(caplog))
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


# ---------------------------------------------------------------------------------------- on the cluster


@pytest.mark.cluster
def test_drain_tells_signals_restarts_across_watcher_kill(clean_cluster, tmp_path):
    """3 opted-in jobs and 1 plain job on one node; the watcher is killed and restarted mid-way."""
    cl = clean_cluster
    others = [n for n in cl.spec.node_names if n.startswith("pre") and n != "pre1"]
    _drain(cl, others, "maintenance: keep the test jobs on pre1")  # excluded by the watcher's rules
    script = _script(cl, "requeue.sh", REQUEUE_SCRIPT)
    opted = [_submit(cl, script, OPTED, "--constraint=preemptible") for _ in range(3)]
    plain = _submit(cl, _script(cl, "plain.sh", PLAIN_SCRIPT), "", "--constraint=preemptible")
    for job_id in [*opted, plain]:
        ready = _ready(cl, job_id) if job_id in opted else cl.wait_state(job_id, "RUNNING")
        assert ready.nodes == ("pre1",)
    cl.slurm.resume(others)
    config = tmp_path / "watch.toml"
    config.write_text('[watch]\nexclude_reasons = ["^maint"]\n')
    argv = [sys.executable, "-m", "slurm_preempt", "watch", "--cluster", "--interval", "1", "--grace", "20"]
    argv += ["--json", "--config", str(config)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _drain(cl, ["pre1"])
        wait_for(lambda: all(any(r.startswith("usr1") for r in _records(cl, j)) for j in opted), 30,
                 what="the 3 handlers to run")  # fmt: skip
        first.send_signal(signal.SIGKILL)  # a crash in the middle: the requeued jobs are not restarted yet
        first.wait(10)
        second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for job_id in opted:  # within seconds, far below Slurm's ~121 s BeginTime wait
            again = cl.wait_state(job_id, "RUNNING", timeout=40)
            assert again.restart_count == 1 and again.nodes != ("pre1",)
        second.terminate()
        out, err = second.communicate(timeout=20)
    except AssertionError:
        first.kill()
        print(first.communicate(timeout=10))
        raise
    finally:
        first.kill()
    state_dir = cl.spec.state_dir
    for job_id in opted:
        kinds = _kinds(state_dir, job_id)
        assert kinds.count("notice_sent") == 1 and kinds.count("signal_sent") == 1, kinds
        assert kinds.count("fast_restart") == 1, kinds
        records = _records(cl, job_id)
        assert [r.split()[0] for r in records] == ["start", "usr1", "start"], records
        assert (cl.workdir / f"ckpt-{job_id}").read_text().strip() == "final checkpoint"
    assert _kinds(state_dir, plain) == ["notice_sent"]
    notice = read_notice(notice_path(state_dir, plain))
    drained = next(iter(cl.slurm.nodes(["pre1"])))
    assert notice.node == "pre1" and notice.deadline == drained.reason_time + timedelta(seconds=20)
    assert cl.job(plain).state == "RUNNING"  # not opted in: notice file only, never a signal
    assert "Traceback" not in err, err


@pytest.mark.cluster
def test_correlated_drain_of_four_nodes_told_in_one_poll(clean_cluster):
    cl = clean_cluster
    script = _script(cl, "record.sh", RECORD_SCRIPT)
    plain_script = _script(cl, "plain.sh", PLAIN_SCRIPT)
    pre = [n for n in cl.spec.node_names if n.startswith("pre")]
    jobs = {}
    for node in pre:
        for i in range(6):
            comment = OPTED if i < 4 else ""
            jobs[_submit(cl, script if comment else plain_script, comment, f"--nodelist={node}")] = comment
    for job_id, comment in jobs.items():
        _ready(cl, job_id) if comment else cl.wait_state(job_id, "RUNNING")
    watcher = _watcher(cl)
    quiet = watcher.poll_once()
    assert quiet.queries == 2 and quiet.new_events == []  # sinfo + pending squeue
    _drain(cl, pre)
    result = watcher.poll_once()
    assert sorted(result.new_events) == pre
    assert result.actions == {"notice_sent": 24, "signal_sent": 16}
    # sinfo, squeue of the draining nodes, squeue of pending jobs, and the pools' sizes (live rate)
    assert result.queries == 4
    opted = [j for j, c in jobs.items() if c]
    wait_for(lambda: all(any(r.startswith("usr1") for r in _records(cl, j)) for j in opted), 20,
             what="16 handlers")  # fmt: skip
    calm = watcher.poll_once()
    assert calm.actions == {} and calm.queries == 2  # nothing told twice, no per-node query
    fresh = _watcher(cl)  # a second watcher, its own state empty: the shared ledger stops it
    assert fresh.poll_once().actions == {}


@pytest.mark.cluster
def test_drain_then_down_then_back_is_one_event_then_a_new_one(clean_cluster, tmp_path):
    cl = clean_cluster
    job_id = _submit(cl, _script(cl, "record.sh", RECORD_SCRIPT), OPTED, "--constraint=preemptible")
    node = _ready(cl, job_id).nodes[0]
    watcher = _watcher(cl, tmp_path)
    _drain(cl, [node])
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    first_time = watcher.sent.events[node].drain_time
    cl.remove_node(node, reason="Not responding")  # DOWN overwrites the reason and its time
    restarted = _watcher(cl, tmp_path)  # a restarted watcher reads what was sent
    wait_for(lambda: cl.job(job_id).state == "PENDING", 30, what="requeue after removal")

    def polled_and_running():
        result = restarted.poll_once()
        assert "notice_sent" not in result.actions and restarted.sent.events[node].drain_time == first_time
        job = cl.job(job_id)
        return job if job.state == "RUNNING" else None

    again = wait_for(polled_and_running, 30, interval=0.5, what="fast restart after the removal")
    assert again.restart_count == 1
    cl.revive_node(node)
    restarted.poll_once()
    assert node not in restarted.sent.events  # back in service: the event is over
    _ready(cl, job_id)  # its trap set again (a signal before it would end the job)
    _drain(cl, again.nodes)
    assert restarted.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}  # a new event
    assert _kinds(cl.spec.state_dir, job_id).count("notice_sent") == 2


@pytest.mark.cluster
def test_fallback_to_standard_after_k_preemptions(clean_cluster):
    cl = clean_cluster
    comment = f"{OPTED} slurm-preempt:fallback-after=2"
    job_id = _submit(cl, _script(cl, "record.sh", RECORD_SCRIPT), comment, "--constraint=preemptible")
    watcher = _watcher(cl)
    for restarts in (1, 2):
        node = _ready(cl, job_id).nodes[0]
        cl.slurm.drain([node], REASON)  # the provider takes the node ...
        watcher.poll_once()  # ... the watcher tells the job ...
        cl.slurm.requeue(job_id)  # ... and the job leaves (as enforcement would make it)
        wait_for(lambda: cl.job(job_id).reason == "BeginTime", 30, what="requeued, waiting BeginTime")

        def polled_and_running():
            watcher.poll_once()
            job = cl.job(job_id)
            return job if job.state == "RUNNING" else None

        job = wait_for(polled_and_running, 30, interval=0.5, what="fast restart")
        assert job.restart_count == restarts and node not in job.nodes
        cl.slurm.resume([node])
    assert job.nodes[0].startswith("std") and job.features == "standard"
    (fallback,) = [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == "fallback"]
    assert "preempted 2 times" in fallback["why"] and fallback["after"] == "standard"


@pytest.mark.cluster
def test_gone_job_is_logged_not_raised(clean_cluster, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    cl = clean_cluster
    job_id = _submit(cl, _script(cl, "plain.sh", PLAIN_SCRIPT), OPTED)
    job = cl.wait_state(job_id, "RUNNING")
    cl.slurm.cancel(job_id)
    wait_for(lambda: cl.job(job_id) is None or cl.job(job_id).state not in ("RUNNING", "COMPLETING"), 20)
    ctx = actions.Context(Slurm(), SentState(), None)
    assert tell.tell(ctx, Outbox(None, ctx.slurm), job, NodeEvent(job.nodes[0], NOW, REASON, "slurm", 20.0))
    assert any("ended before" in line for line in _lines(caplog))


@pytest.mark.cluster
def test_sidecar_alone_gets_a_job_through_a_drain(clean_cluster):
    cl = clean_cluster
    sidecar = (
        f'{sys.executable} -m slurm_preempt watch --sidecar --job "$SLURM_JOB_ID" --grace 20 --interval 1 &'
    )
    script = _script(cl, "sidecar.sh", REQUEUE_SCRIPT, extra=sidecar)
    job_id = _submit(cl, script, OPTED, "--constraint=preemptible")
    node = _ready(cl, job_id).nodes[0]
    side_state = state_path(cl.spec.state_dir, job_id)
    wait_for(side_state.exists, 20, what="the sidecar's first poll")  # fmt: skip
    _drain(cl, [node])
    wait_for(lambda: any(r.startswith("usr1") for r in _records(cl, job_id)), 20, what="the handler")
    requeued = wait_for(lambda: (j := cl.job(job_id)) and j.restart_count == 1 and j, 30, what="requeue")
    assert requeued.state in ("PENDING", "REQUEUED", "COMPLETING", "RUNNING")
    assert (cl.workdir / f"ckpt-{job_id}").exists()
    # Recorded before it was sent: the signal ends the job, and the sidecar with it, at once.
    assert _kinds(cl.spec.state_dir, job_id) == ["notice_sent", "signal_sent"]
    saved = json.loads(Path(side_state).read_text())
    assert saved["told"][f"{job_id}|{node}"]["notice"]  # saved before the signal


def test_broken_state_folder_is_logged_not_raised(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the state folder should be")
    sent = SentState(path=blocked / "watcher" / "sent.json")
    watcher = Watcher(Slurm(), Settings(), sent, blocked)
    job = Job("42", "RUNNING", nodes=("pre1",), comment="")  # not opted in: no Slurm call
    event = NodeEvent("pre1", NOW, REASON, "slurm", 20.0)
    assert not tell.tell(watcher.ctx, watcher.outbox, job, event)  # retried on the next poll
    watcher._save()
    watcher._save()
    lines = _lines(caplog)
    assert any("cannot write the notice" in line for line in lines)
    assert sum("cannot save the watcher state" in line for line in lines) == 1


@pytest.mark.cluster
def test_job_on_two_draining_nodes_is_told_once(clean_cluster):
    cl = clean_cluster
    job_id = _submit(
        cl, _script(cl, "record.sh", RECORD_SCRIPT), OPTED, "--nodes=2", "--constraint=preemptible"
    )
    nodes = _ready(cl, job_id).nodes
    assert len(nodes) == 2
    watcher = _watcher(cl)
    _drain(cl, nodes)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert watcher.poll_once().actions == {}
    assert all(watcher.sent.done(job_id, n, "signal") for n in nodes)


@pytest.mark.cluster
def test_array_task_signalled_alone(clean_cluster):
    """On 22.05 one task of an array runs with the array's own id as its job id: signalling that id
    would reach every task. The watcher names tasks A_T, so only the task on the drained node hears."""
    cl = clean_cluster
    script = _script(cl, "record.sh", RECORD_SCRIPT)
    array_id = _submit(cl, script, OPTED, "--array=0-2", "--exclusive", "--constraint=preemptible")

    def all_running():
        tasks = [j for j in cl.slurm.jobs() if j.array_job_id == array_id and j.running]
        return tasks if len(tasks) == 3 else None

    tasks = wait_for(all_running, 30, what="three array tasks running")
    for task in tasks:
        _ready(cl, task.job_id)
    carrier = next(t for t in tasks if t.job_id == array_id)  # the task holding the array's id
    cl.slurm.drain(list(carrier.nodes), REASON)
    _watcher(cl).poll_once()
    wait_for(lambda: any(r.startswith("usr1") for r in _records(cl, carrier.job_id)), 10, what="USR1")
    others = [t for t in tasks if t.job_id != array_id]
    assert all(not any(r.startswith("usr1") for r in _records(cl, t.job_id)) for t in others)
    cl.slurm.resume(list(carrier.nodes))
