"""The watcher's decisions against an in-memory Slurm (tests/fakeslurm.py), with injected time.

What Slurm itself does is tested on the real cluster (test_watcher.py, test_watcher_cli.py); here every
rule of who is told what, when and how often, runs in milliseconds and without sleeping.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from fakeslurm import T0, Clock, FakeSlurm
from slurm_preempt import ledger
from slurm_preempt.errors import SlurmError, WatcherError
from slurm_preempt.notice import Notice, notice_path, read_notice
from slurm_preempt.watch.lease import Lease
from slurm_preempt.watch.loop import run
from slurm_preempt.watch.outbox import Outbox
from slurm_preempt.watch.sdnotify import Notifier
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.sources import Drain, SourceError
from slurm_preempt.watch.watcher import Watcher, load_sent, state_path

OPTED = "slurm-preempt:signal=USR1"
REASON = "TogetherPreemptionNotified: reclaimed"
GRACE = 300.0


@dataclass
class World:
    clock: Clock
    slurm: FakeSlurm
    state_dir: Path

    def watcher(
        self, job_id: str | None = None, sources=(), user: str | None = None, lease=None, **settings
    ) -> Watcher:
        """A watcher whose state is loaded from disk: a second one is a restarted watcher."""
        sent = load_sent(state_path(self.state_dir, job_id, user))
        values = {"grace": GRACE, **settings}
        return Watcher(
            self.slurm,
            Settings(**values),
            sent,
            self.state_dir,
            sources,
            job_id=job_id,
            clock=self.clock,
            user=user,
            lease=lease,
        )

    def pair_member(self, host: str, ticks: Ticks, **settings) -> Watcher:
        """One of two watchers sharing the daemon's state (two hosts: each its own monotonic clock)."""
        lease = Lease(state_path(self.state_dir), ttl=30, monotonic=ticks, host=host, pid=1)
        watcher = self.watcher(lease=lease, **settings)
        watcher.outbox.monotonic = ticks
        return watcher

    def kinds(self, job_id: str) -> list[str]:
        return [e["kind"] for e in ledger.events(self.state_dir, job_id)]

    def notice(self, job_id: str) -> Notice | None:
        return read_notice(notice_path(self.state_dir, job_id))


class Ticks:
    """A host's monotonic clock, moved on by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Killed(BaseException):
    """The watcher's process dies here (SIGKILL): nothing after this line of it runs."""


@pytest.fixture
def world(tmp_path) -> World:
    clock = Clock()
    return World(clock, FakeSlurm(clock), tmp_path / "state")


@dataclass
class ListSource:
    """A provider API whose answer the test sets; ``failing`` makes it raise."""

    name: str = "together"
    drains: list[Drain] = field(default_factory=list)
    failing: bool = False

    def fetch(self) -> list[Drain]:
        if self.failing:
            raise SourceError("https://api.example/v1 answered HTTP 500")
        return list(self.drains)


def _signalled(world: World) -> list[str]:
    return [i for call in world.slurm.called("signal_many") for i in call["job_ids"]]


# ---------------------------------------------------------------------------------------- telling


def test_drain_tells_every_job_on_the_node_once_and_signals_only_opted_in(world):
    fake = world.slurm
    for job_id in ("1", "2"):
        fake.add_job(job_id, ["pre1"], OPTED)
    fake.add_job("3", ["pre1"], "")  # did not opt in: notice file only
    fake.add_job("4", ["pre2"], OPTED)  # on a node that stays
    watcher = world.watcher()
    quiet = watcher.poll_once()
    assert quiet.queries == 2 and quiet.actions == {} and quiet.new_events == []
    fake.drain(["pre1"], REASON)
    world.clock.advance(200)  # a late watcher: the deadline still counts from the drain
    result = watcher.poll_once()
    assert result.new_events == ["pre1"] and result.draining == ["pre1"]
    assert result.actions == {"notice_sent": 3, "signal_sent": 2}
    assert result.queries == 3  # sinfo, squeue of the draining node, squeue of pending jobs
    assert fake.called("signal_many") == [{"job_ids": ("1", "2"), "signal": "USR1", "batch_only": True}]
    assert [fake.job(j).signals for j in ("1", "2", "3", "4")] == [["USR1"], ["USR1"], [], []]
    for job_id in ("1", "2", "3"):
        notice = world.notice(job_id)
        assert notice.deadline == T0 + timedelta(seconds=GRACE) and notice.detected_at == world.clock()
        assert notice.event_id == f"pre1@{T0:%Y-%m-%dT%H:%M:%SZ}"
    assert world.notice("4") is None
    assert world.kinds("3") == ["notice_sent"] and world.kinds("1") == ["notice_sent", "signal_sent"]
    calm = watcher.poll_once()
    assert calm.actions == {} and calm.queries == 2  # nothing told twice, no query of the nodes' jobs
    assert _signalled(world) == ["1", "2"]


def test_every_notice_is_written_before_any_signal(world):
    fake = world.slurm
    for i in range(12):
        fake.add_job(str(i), [f"pre{i % 4 + 1}"], OPTED)
    missing: list[str] = []
    fake.on_signal = lambda ids: missing.extend(j for j in map(str, range(12)) if world.notice(j) is None)
    fake.drain(["pre1", "pre2", "pre3", "pre4"], REASON)
    assert world.watcher().poll_once().actions == {"notice_sent": 12, "signal_sent": 12}
    assert missing == []


def test_correlated_drain_is_told_in_one_poll_each_job_signalled_once(world):
    fake = world.slurm
    opted = []
    for node in ("pre1", "pre2", "pre3", "pre4"):
        for i in range(6):
            job_id = f"{node[-1]}{i}"
            fake.add_job(job_id, [node], OPTED if i < 4 else "")
            opted += [job_id] if i < 4 else []
    watcher = world.watcher()
    fake.drain(["pre1", "pre2", "pre3", "pre4"], REASON)
    result = watcher.poll_once()
    assert result.actions == {"notice_sent": 24, "signal_sent": 16} and result.queries == 3
    assert sorted(_signalled(world)) == sorted(opted)  # in several scancel calls side by side, once each
    assert len(fake.called("signal_many")) > 1
    assert watcher.poll_once().actions == {}


def test_drain_then_down_is_the_same_event(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    world.clock.advance(GRACE)
    fake.set_down(["pre1"], "Not responding")  # overwrites the reason and its time
    fake.requeue_by_job("1")  # the removal requeues the job
    result = watcher.poll_once()
    assert result.new_events == [] and result.draining == ["pre1"]
    assert "notice_sent" not in result.actions and "signal_sent" not in result.actions
    assert watcher.sent.events["pre1"].drain_time == T0  # the first drain time is kept
    assert world.kinds("1").count("notice_sent") == 1


def test_resumed_and_drained_again_is_a_new_event(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    world.clock.advance(60)
    fake.resume(["pre1"])
    assert watcher.poll_once().draining == []  # back in service: its event is over
    world.clock.advance(60)
    fake.drain(["pre1"], REASON)
    again = watcher.poll_once()
    assert again.new_events == ["pre1"] and again.actions == {"notice_sent": 1, "signal_sent": 1}
    assert world.notice("1").drain_time == T0 + timedelta(seconds=120)
    # Resumed and drained again between two polls: a new drain time on a node not DOWN.
    world.clock.advance(60)
    fake.resume(["pre1"])
    fake.drain(["pre1"], REASON)
    third = watcher.poll_once()
    assert third.actions == {"notice_sent": 1, "signal_sent": 1}
    assert world.kinds("1").count("notice_sent") == 3 and fake.job("1").signals == ["USR1"] * 3


def test_job_on_two_draining_nodes_is_told_once_with_the_earliest_deadline(world):
    fake = world.slurm
    fake.add_job("1", ["pre1", "pre2"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre2"], REASON)
    world.clock.advance(10)
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    notice = world.notice("1")
    assert notice.node == "pre2" and notice.deadline == T0 + timedelta(seconds=GRACE)
    assert watcher.poll_once().actions == {}
    assert all(watcher.sent.done("1", n, what) for n in ("pre1", "pre2") for what in ("notice", "signal"))
    assert fake.job("1").signals == ["USR1"]


def test_a_later_drain_of_another_node_never_tells_the_job_again_nor_postpones_its_deadline(world):
    """Bug: when the job's second node drained in a LATER poll, the job was told again, and its notice
    overwritten with the later deadline (06:05:00 -> 06:06:00, USR1 twice)."""
    fake = world.slurm
    fake.add_job("1", ["pre1", "pre2"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    world.clock.advance(60)
    fake.drain(["pre2"], REASON)
    later = watcher.poll_once()
    assert later.new_events == ["pre2"] and later.actions == {}
    assert world.notice("1").deadline == T0 + timedelta(seconds=GRACE)  # 06:05:00, not 06:06:00
    assert fake.job("1").signals == ["USR1"] and world.kinds("1") == ["notice_sent", "signal_sent"]
    restarted = world.watcher()  # also after a restart of the watcher
    assert restarted.poll_once().actions == {} and fake.job("1").signals == ["USR1"]


def test_a_later_event_with_an_earlier_deadline_rewrites_the_notice_without_a_second_signal(world):
    fake = world.slurm
    fake.add_job("1", ["pre1", "pre2"], OPTED)
    provider = ListSource(drains=[])
    watcher = world.watcher(sources=[provider])
    fake.drain(["pre1"], REASON)  # deadline T0 + 300
    watcher.poll_once()
    world.clock.advance(60)
    provider.drains = [Drain("pre2", "provider", world.clock(), "together", 30.0)]  # deadline T0 + 90
    assert watcher.poll_once().actions == {"notice_sent": 1}
    assert world.notice("1").deadline == T0 + timedelta(seconds=90) and world.notice("1").node == "pre2"
    assert fake.job("1").signals == ["USR1"]
    assert watcher.poll_once().actions == {}


def test_a_job_requeued_and_running_elsewhere_is_told_again_in_its_new_attempt(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    fake.requeue_by_job("1")
    watcher.poll_once()  # fast restart: pre1 is still drained
    fake.start("1", ["pre3"])
    world.clock.advance(30)
    fake.drain(["pre3"], REASON)  # pre1's event is still open, but this is a new attempt
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert world.notice("1").node == "pre3" and fake.job("1").signals == ["USR1", "USR1"]


def test_sources_of_one_node_keep_the_earliest_drain(world):
    fake = world.slurm
    fake.add_job("1", ["pre3"], OPTED)
    provider = ListSource(drains=[Drain("pre3", "provider", T0 - timedelta(seconds=30), "together", 120.0)])
    fake.drain(["pre3"], REASON)
    world.watcher(sources=[provider]).poll_once()
    notice = world.notice("1")
    assert notice.source == "together" and notice.deadline == T0 + timedelta(seconds=90)


# ---------------------------------------------------------------------------------------- failures


def test_a_failed_signal_is_retried_next_poll_and_never_doubled(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    fake.add_job("2", ["pre1"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    fake.fail_next("signal_many")  # scancel timed out: nothing is known to be sent
    first = watcher.poll_once()
    assert first.actions == {"notice_sent": 2}
    second = watcher.poll_once()
    assert second.actions == {"signal_sent": 2} and second.queries == 3  # the node's jobs asked again
    assert watcher.poll_once().actions == {}
    assert world.kinds("1") == ["notice_sent", "signal_sent"] == world.kinds("2")


def test_scancel_naming_one_job_retries_that_job_only(world, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    fake = world.slurm
    for job_id in ("1", "2", "3"):
        fake.add_job(job_id, ["pre1"], OPTED)
    fake.refused["2"] = "Access/permission denied"
    fake.drain(["pre1"], REASON)
    watcher = world.watcher()
    assert watcher.poll_once().actions == {"notice_sent": 3, "signal_sent": 2}
    assert any("job 2: signal USR1 failed, will retry" in r.getMessage() for r in caplog.records)
    del fake.refused["2"]
    assert watcher.poll_once().actions == {"signal_sent": 1}
    assert _signalled(world) == ["1", "2", "3", "2"]
    assert [fake.job(j).signals for j in ("1", "2", "3")] == [["USR1"]] * 3


def test_a_job_gone_before_its_signal_is_done_not_retried(world, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    fake.drain(["pre1"], REASON)
    fake.on_signal = lambda ids: fake.end("1")  # it ended between the query and the signal
    watcher = world.watcher()
    assert watcher.poll_once().actions == {"notice_sent": 1}
    assert any("job 1 ended before it could be signalled" in r.getMessage() for r in caplog.records)
    assert watcher.sent.done("1", "pre1", "signal")
    watcher.poll_once()
    assert len(fake.called("signal_many")) == 1


def test_a_failed_query_is_retried_next_poll(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    fake.fail_next("nodes")
    with pytest.raises(SlurmError):
        watcher.poll_once()
    fake.fail_next("jobs")  # sinfo answers, the squeue of the node's jobs times out
    with pytest.raises(SlurmError):
        watcher.poll_once()
    assert watcher.sent.events["pre1"].handled is False
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert watcher.poll_once().actions == {}
    assert world.kinds("1") == ["notice_sent", "signal_sent"]


def test_a_restarted_watcher_tells_nobody_twice(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    fake.add_job("2", ["pre1"], OPTED)
    fake.drain(["pre1"], REASON)
    fake.fail_next("signal_many")
    assert world.watcher().poll_once().actions == {"notice_sent": 2}  # then the watcher dies
    restarted = world.watcher()  # reads what was sent from its state file
    assert restarted.sent.done("1", "pre1", "notice") and not restarted.sent.done("1", "pre1", "signal")
    assert restarted.poll_once().actions == {"signal_sent": 2}  # only what was not done yet
    assert world.watcher().poll_once().actions == {}
    # State lost (another host, a sidecar): the shared ledger still says what was sent.
    state_path(world.state_dir, None).unlink()
    assert world.watcher().poll_once().actions == {}
    assert world.watcher(job_id="1").poll_once().actions == {}  # the job's own sidecar too
    assert [fake.job(j).signals for j in ("1", "2")] == [["USR1"], ["USR1"]]


# ---------------------------------------------------------------------------------------- after the notice


def test_fast_restart_only_while_the_nodes_it_left_are_away(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    fake.add_job("2", ["pre2"], OPTED)
    fake.add_job("3", ["pre3"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1", "pre2"], REASON)
    watcher.poll_once()
    for job_id in ("1", "2", "3"):
        fake.requeue_by_job(job_id)  # 1 and 2 leave after the notice; 3 is requeued by hand
    fake.resume(["pre2"])  # pre2 back before the next poll: job 2 could land on it again
    first = watcher.poll_once()
    assert first.actions == {"fast_restart": 1}
    assert fake.called("update_job") == [{"job_id": "1", "starttime": "now"}]
    fake.job("1").reason = "BeginTime"  # still COMPLETING: Slurm accepted it but it did not take
    assert watcher.poll_once().actions == {}  # sent again, recorded once per restart
    assert fake.called("update_job")[-1] == {"job_id": "1", "starttime": "now"}
    assert world.kinds("1").count("fast_restart") == 1
    assert "fast_restart" not in world.kinds("2") and "fast_restart" not in world.kinds("3")
    assert {c["job_id"] for c in fake.called("update_job")} == {"1"}


def test_fast_restart_is_off_when_the_job_says_so(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], f"{OPTED} slurm-preempt:fast-restart=0")
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    fake.requeue_by_job("1")
    assert watcher.poll_once().actions == {} and fake.called("update_job") == []


def test_fallback_after_k_preemptions_once(world):
    fake = world.slurm
    fake.add_job("1", [], f"{OPTED} slurm-preempt:fallback-after=2", features="preemptible", restart_count=1)
    fake.job("1").reason = "BeginTime"
    watcher = world.watcher(fast_restart=False)
    assert watcher.poll_once().actions == {}  # preempted once: stays
    fake.job("1").restart_count = 2
    fake.fail_next("update_job")
    assert watcher.poll_once().actions == {}  # scontrol failed: retried next poll
    assert watcher.poll_once().actions == {"fallback": 1}
    assert fake.job("1").features == "standard"
    assert watcher.poll_once().actions == {}
    (event,) = [e for e in ledger.events(world.state_dir, "1") if e["kind"] == "fallback"]
    assert "preempted 2 times" in event["why"] and event["before"] == "preemptible"
    assert len(fake.called("update_job")) == 2


def test_fallback_after_pending_too_long(world):
    fake = world.slurm
    comment = f"{OPTED} slurm-preempt:fallback-pending=600 slurm-preempt:fallback-to=ondemand"
    fake.add_job("1", [], comment, features="preemptible")
    watcher = world.watcher()
    world.clock.advance(599)
    assert watcher.poll_once().actions == {}
    world.clock.advance(1)
    assert watcher.poll_once().actions == {"fallback": 1}
    assert fake.called("update_job") == [{"job_id": "1", "features": "ondemand"}]
    world.clock.advance(600)
    assert watcher.poll_once().actions == {}


def test_enforcement_requeues_opted_in_jobs_still_running_near_the_deadline(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    fake.add_job("2", ["pre1"], "")  # not opted in: never requeued
    watcher = world.watcher(grace=60, enforce=True, enforce_margin=10, fast_restart=False, fallback=False)
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 2, "signal_sent": 1}
    world.clock.advance(49)
    early = watcher.poll_once()
    assert early.actions == {} and early.queries == 1  # sinfo only: fast restart and fallback are off
    world.clock.advance(1)  # deadline - margin
    due = watcher.poll_once()
    assert due.actions == {"enforced_requeue": 1} and due.queries == 2
    assert fake.called("requeue") == [{"job_id": "1"}]
    assert fake.job("1").state == "PENDING" and fake.job("2").state == "RUNNING"
    assert watcher.poll_once().actions == {}  # once per event
    assert world.kinds("1") == ["notice_sent", "signal_sent", "enforced_requeue"]


def test_a_failed_enforced_requeue_is_retried(world):
    """Bug: a failed enforced requeue (a Slurm error other than "job gone") was never retried, because
    the event was marked enforced either way."""
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    watcher = world.watcher(grace=60, enforce=True, enforce_margin=10, fast_restart=False, fallback=False)
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    world.clock.advance(50)
    fake.fail_next("requeue", SlurmError(["scontrol", "requeue", "1"], 1, "slurm_requeue error: Unexpected"))
    assert watcher.poll_once().actions == {}
    assert "enforced_requeue" not in world.kinds("1")  # the record of a failed act is taken back
    assert watcher.poll_once().actions == {"enforced_requeue": 1}
    assert fake.job("1").state == "PENDING" and len(fake.called("requeue")) == 2
    assert watcher.poll_once().actions == {}


def test_a_job_on_two_enforcing_nodes_is_requeued_once(world):
    fake = world.slurm
    fake.add_job("1", ["pre1", "pre2"], OPTED)
    watcher = world.watcher(grace=60, enforce=True, enforce_margin=10, fast_restart=False, fallback=False)
    fake.drain(["pre1", "pre2"], REASON)
    watcher.poll_once()
    world.clock.advance(50)
    assert watcher.poll_once().actions == {"enforced_requeue": 1}
    assert fake.called("requeue") == [{"job_id": "1"}]


# ---------------------------------------------------------------------------------------- sources, modes


def test_a_provider_event_ends_only_after_its_deadline(world):
    fake = world.slurm
    fake.add_job("1", ["pre2"], OPTED)
    provider = ListSource(drains=[Drain("pre2", "TogetherPreemptionNotified", T0, "together", 30.0)])
    watcher = world.watcher(sources=[provider])
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    provider.failing = True  # the API fails: its last answer stands
    world.clock.advance(5)
    assert watcher.poll_once().draining == ["pre2"]
    provider.failing, provider.drains = False, []  # the API forgets the event
    world.clock.advance(5)
    assert watcher.poll_once().draining == ["pre2"]  # kept until its deadline is past
    provider.drains = [Drain("pre2", "TogetherPreemptionNotified", T0, "together", 30.0)]
    assert watcher.poll_once().actions == {}  # it comes back: the same event, not told again
    provider.drains = []
    world.clock.advance(80)  # deadline + 60 s
    assert watcher.poll_once().draining == ["pre2"]
    world.clock.advance(1)
    assert watcher.poll_once().draining == []
    assert world.kinds("1") == ["notice_sent", "signal_sent"]


def test_a_failing_source_is_logged_once_then_now_and_then(world, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    provider = ListSource(failing=True)
    watcher = world.watcher(sources=[provider])
    for _ in range(61):
        watcher.poll_once()
    lines = [r.getMessage() for r in caplog.records if "source together" in r.getMessage()]
    assert len(lines) == 2 and "failure 1;" in lines[0] and "failure 60;" in lines[1]


def test_sidecar_tells_only_its_own_job_and_ends_with_it(world):
    fake = world.slurm
    fake.add_job("7", ["pre1"], OPTED)
    fake.add_job("8", ["pre1"], OPTED)
    fake.add_job("9", ["pre2"], OPTED)
    sidecar = world.watcher(job_id="7", fast_restart=False, fallback=False)
    quiet = sidecar.poll_once()
    assert quiet.queries == 2 and quiet.actions == {}
    assert fake.called("jobs")[-1]["job_ids"] == ("7",) and fake.called("nodes")[-1]["names"] == ("pre1",)
    fake.drain(["pre2"], REASON)
    assert sidecar.poll_once().new_events == []  # not its node
    fake.drain(["pre1"], REASON)
    assert sidecar.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert _signalled(world) == ["7"] and world.notice("8") is None
    assert state_path(world.state_dir, "7").exists()
    fake.requeue_by_job("7")  # pending: not running any more
    assert sidecar.poll_once().job_ended
    fake.end("7")
    assert sidecar.poll_once().job_ended


def test_array_tasks_are_named_a_t_in_every_action(world):
    """On 22.05 one task of an array carries the array's own id: that id names the whole array."""
    fake = world.slurm
    tasks = {"100": ("0", "pre1"), "101": ("1", "pre2"), "102": ("2", "pre3")}
    for job_id, (task, node) in tasks.items():
        comment = f"{OPTED} slurm-preempt:fallback-after=1"
        fake.add_job(job_id, [node], comment, array_job_id="100", array_task_id=task, features="preemptible")
    watcher = world.watcher(grace=60, enforce=True, enforce_margin=10)
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    assert [fake.job(j).signals for j in tasks] == [["USR1"], [], []]
    world.clock.advance(50)
    assert watcher.poll_once().actions == {"enforced_requeue": 1, "fallback": 1, "fast_restart": 1}
    assert [fake.job(j).state for j in tasks] == ["PENDING", "RUNNING", "RUNNING"]
    assert fake.called("signal_many")[0]["job_ids"] == ("100_0",)
    assert fake.called("requeue") == [{"job_id": "100_0"}]
    assert fake.called("update_job") == [
        {"job_id": "100_0", "features": "standard"},
        {"job_id": "100_0", "starttime": "now"},
    ]
    kinds = ["notice_sent", "signal_sent", "enforced_requeue", "fallback", "fast_restart"]
    assert world.kinds("100") == kinds


# ---------------------------------------------------------------------------------------- the loop


class CountingStop:
    """A stop event whose ``wait`` returns at once, noting how long it was asked to wait."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.waits: list[float] = []

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return len(self.waits) >= self.rounds


def test_loop_backs_off_and_logs_an_unexpected_error_with_its_traceback(world, caplog):
    caplog.set_level(logging.DEBUG, logger="slurm_preempt")
    fake = world.slurm
    fake.fail_next("nodes", times=2)
    fake.fail_next("jobs", RuntimeError("boom"))
    watcher = world.watcher(interval=10, max_backoff=60)
    stop = CountingStop(rounds=5)
    assert run(watcher, stop=stop) == 0
    # sinfo fails twice, the pending squeue raises a bug, then two good polls
    assert stop.waits == pytest.approx([20, 40, 60, 10, 10], abs=5)
    records = [r for r in caplog.records if r.name == "slurm_preempt.watch.loop"]
    assert [r.levelname for r in records] == ["WARNING", "ERROR", "INFO"]
    assert "retry 1" in records[0].getMessage()
    assert records[1].getMessage() == "unexpected RuntimeError: boom (1 in a row)"
    assert records[1].exc_info is not None  # the traceback, at ERROR: a bug is never a one-liner
    assert records[2].getMessage() == "polls work again after 3 failed one(s)"


def test_a_slurm_outage_is_logged_at_the_first_failure_then_every_tenth(world, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    world.slurm.fail_next("nodes", times=25)
    watcher = world.watcher(interval=1, max_backoff=60)
    stop = CountingStop(rounds=27)
    assert run(watcher, stop=stop) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "slurm_preempt.watch.loop"]
    assert [line.split(";")[1] for line in lines[:3]] == [" retry 1, backing off", " retry 10, backing off",
                                                          " retry 20, backing off"]  # fmt: skip
    assert lines[3:] == ["polls work again after 25 failed one(s)"]
    assert max(stop.waits) == pytest.approx(60, abs=1) and stop.waits[-1] == pytest.approx(1, abs=1)


def test_the_same_unexpected_error_poll_after_poll_ends_the_loop_non_zero(world):
    world.slurm.fail_next("nodes", KeyError("pre1"), times=3)
    watcher = world.watcher(interval=1, crash_after=3)
    with pytest.raises(WatcherError, match="3 polls in a row failed with an unexpected error"):
        run(watcher, stop=CountingStop(rounds=99))
    world.slurm.fail_next("nodes", KeyError("pre1"), times=2)  # twice, then a good poll: carries on
    assert run(world.watcher(interval=1, crash_after=3), stop=CountingStop(rounds=4)) == 0


def test_loop_ends_when_the_sidecars_job_ends(world):
    watcher = world.watcher(job_id="5")  # no such job
    stop = CountingStop(rounds=99)
    assert run(watcher, stop=stop) == 0 and stop.waits == []


def test_poll_result_json_names_what_was_done(world):
    world.slurm.add_job("1", ["pre1"], OPTED)
    world.slurm.drain(["pre1"], REASON)
    got = world.watcher().poll_once().to_json()
    assert got == {
        "event": "poll",
        "queries": 3,
        "draining": ["pre1"],
        "new_events": ["pre1"],
        "actions": {"notice_sent": 1, "signal_sent": 1},
        "job_ended": False,
        "standby": False,
    }


# ---------------------------------------------------------------------------------------- records, pairs


def test_a_signal_that_ends_its_sender_is_already_in_the_ledger(world):
    """A job's sidecar dies with the job its signal makes leave (the job requeues itself): what it did
    was recorded before it did it."""
    fake = world.slurm
    fake.add_job("7", ["pre1"], OPTED)
    fake.drain(["pre1"], REASON)

    def requeued_and_killed(_ids):
        fake.requeue_by_job("7")
        raise Killed  # Slurm ends the job's processes, the sidecar among them

    fake.on_signal = requeued_and_killed
    with pytest.raises(Killed):
        world.watcher(job_id="7", fast_restart=False, fallback=False).poll_once()
    assert world.kinds("7") == ["notice_sent", "signal_sent"]


def test_a_failed_act_takes_its_record_back(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    fake.drain(["pre1"], REASON)
    fake.refused["1"] = "Access/permission denied"
    watcher = world.watcher()
    watcher.poll_once()
    assert world.kinds("1") == ["notice_sent"]  # the signal_sent written before scancel is taken back
    del fake.refused["1"]
    watcher.poll_once()
    assert world.kinds("1") == ["notice_sent", "signal_sent"]


def _jobs_on_every_node(fake, count: int) -> list[str]:
    ids = [str(100 + i) for i in range(count)]
    for i, job_id in enumerate(ids):
        fake.add_job(job_id, [f"pre{i % 4 + 1}"], OPTED)
    return ids


def test_two_watchers_one_acts_the_standby_takes_over_when_it_dies(world):
    fake = world.slurm
    ids = _jobs_on_every_node(fake, 8)
    a_ticks, b_ticks = Ticks(), Ticks()
    a, b = world.pair_member("hostA", a_ticks), world.pair_member("hostB", b_ticks)
    assert a.poll_once().queries == 2
    standby = b.poll_once()
    assert standby.standby and standby.queries == 0 and fake.queries() == 2  # B asks Slurm nothing
    fake.drain(["pre1", "pre2"], REASON)
    assert a.poll_once().actions == {"notice_sent": 4, "signal_sent": 4}
    # A dies. B sees its beat stop; after the lease's ttl on B's own clock it takes over.
    b_ticks.now += 29
    assert b.poll_once().standby
    b_ticks.now += 1
    fake.drain(["pre3"], REASON)
    took_over = b.poll_once()
    assert not took_over.standby and took_over.actions == {"notice_sent": 2, "signal_sent": 2}
    assert took_over.draining == ["pre1", "pre2", "pre3"]  # A's events, from the shared state
    assert sorted(_signalled(world)) == sorted(j for j in ids if fake.job(j).nodes[0] != "pre4")
    assert all(world.kinds(j).count("signal_sent") == 1 for j in ids if fake.job(j).signals)


def test_killed_after_the_intent_before_the_signal_the_survivor_sends_it_once(world, monkeypatch):
    fake = world.slurm
    ids = _jobs_on_every_node(fake, 12)
    a_ticks, b_ticks = Ticks(), Ticks()
    a, b = world.pair_member("hostA", a_ticks), world.pair_member("hostB", b_ticks)
    assert not a.poll_once().standby and b.poll_once().standby
    fake.drain(["pre1", "pre2", "pre3", "pre4"], REASON)
    with monkeypatch.context() as patch:
        patch.setattr(Outbox, "_run", lambda *_a: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            a.poll_once()  # notices written, intents and signal_sent records written, nothing sent
    assert _signalled(world) == [] and all(world.notice(j) for j in ids)
    b_ticks.now += 30
    took_over = b.poll_once()
    assert took_over.actions == {"signal_sent": 12}  # the leftover intents, claimed and sent
    assert sorted(_signalled(world)) == sorted(ids)
    assert all(world.kinds(j) == ["notice_sent", "signal_sent"] for j in ids)
    assert b.poll_once().actions == {} and len(_signalled(world)) == 12


def test_killed_after_the_signal_before_confirming_the_survivor_only_confirms(world, monkeypatch):
    fake = world.slurm
    ids = _jobs_on_every_node(fake, 12)
    a_ticks, b_ticks = Ticks(), Ticks()
    a, b = world.pair_member("hostA", a_ticks), world.pair_member("hostB", b_ticks)
    assert not a.poll_once().standby and b.poll_once().standby
    fake.drain(["pre1", "pre2", "pre3", "pre4"], REASON)
    real_run = Outbox._run

    def sent_then_killed(self, intents):
        real_run(self, intents)  # the helpers finish (they outlive the watcher) ...
        raise Killed  # ... but the watcher dies before reading their outcome

    with monkeypatch.context() as patch:
        patch.setattr(Outbox, "_run", sent_then_killed)
        with pytest.raises(Killed):
            a.poll_once()
    assert sorted(_signalled(world)) == sorted(ids)
    b_ticks.now += 30
    assert b.poll_once().actions == {"signal_sent": 12}  # confirmed from the outcome files, not sent
    assert len(_signalled(world)) == 12
    assert all(world.kinds(j) == ["notice_sent", "signal_sent"] for j in ids)


def test_a_claim_whose_sender_died_with_its_host_is_taken_as_sent_never_resent(world, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    fake = world.slurm
    ids = _jobs_on_every_node(fake, 4)
    a_ticks, b_ticks = Ticks(), Ticks()
    a, b = world.pair_member("hostA", a_ticks), world.pair_member("hostB", b_ticks)
    assert not a.poll_once().standby and b.poll_once().standby
    fake.drain(["pre1", "pre2", "pre3", "pre4"], REASON)
    fake.on_signal = lambda _ids: (_ for _ in ()).throw(Killed())  # the host dies mid-scancel
    with pytest.raises(Killed):
        a.poll_once()
    fake.on_signal = lambda _ids: None
    b_ticks.now += 30
    assert b.poll_once().actions == {}  # claimed by a sender that may still run: in flight, not resent
    b_ticks.now += 15 + 30  # the Slurm timeout and the helper's grace: that sender is dead
    assert b.poll_once().actions == {"signal_sent": 4}
    assert len(fake.called("signal_many")) == 1  # at most once: never sent twice
    assert sum("taken as sent" in r.getMessage() for r in caplog.records) == 4
    assert all(world.kinds(j) == ["notice_sent", "signal_sent"] for j in ids)


# ---------------------------------------------------------------------------------------- modes, start-up


def test_a_users_watcher_asks_and_acts_only_for_that_users_jobs(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED, user="alice")
    fake.add_job("2", ["pre1"], OPTED, user="bob")
    fake.add_job("3", [], OPTED, user="bob", restart_count=1, reason="BeginTime")
    watcher = world.watcher(user="alice")
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert {c["user"] for c in fake.called("jobs")} == {"alice"}
    assert _signalled(world) == ["1"] and world.notice("2") is None
    assert state_path(world.state_dir, user="alice").exists()
    fake.requeue_by_job("1")
    assert watcher.poll_once().actions == {"fast_restart": 1}  # an owner may release its own job
    assert fake.called("update_job") == [{"job_id": "1", "starttime": "now"}]


def test_start_up_after_an_earlier_run_logs_the_events_it_left_once_in_one_line(world, caplog):
    caplog.set_level(logging.INFO, logger="slurm_preempt")
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    earlier = world.watcher()
    fake.drain(["pre1", "pre2", "pre3", "pre4"], REASON)
    earlier.poll_once()  # then it stops; the nodes come back while no watcher runs
    fake.resume(["pre1", "pre2", "pre3", "pre4"])
    caplog.clear()
    fresh = world.watcher()
    for _ in range(3):
        fresh.poll_once()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["4 drain event(s) left open by an earlier run are over: pre1, pre2, pre3, pre4"]
    fake.drain(["pre2"], REASON)
    fresh.poll_once()
    fake.resume(["pre2"])
    caplog.clear()
    fresh.poll_once()
    fresh.poll_once()
    assert [r.getMessage() for r in caplog.records] == [
        "node pre2: back in service or drained anew; its event is over"
    ]


def test_fallback_pending_counts_from_when_the_job_became_eligible(world):
    """A requeue resets SubmitTime (22.05 and 24.11), and the ~121 s BeginTime hold after it is not a
    lack of capacity: the pending time starts at EligibleTime when that is later."""
    fake = world.slurm
    comment = f"{OPTED} slurm-preempt:fallback-pending=100 slurm-preempt:fast-restart=0"
    job = fake.add_job("1", [], comment, features="preemptible", restart_count=1, reason="BeginTime")
    job.eligible_time = T0 + timedelta(seconds=121)  # held until then
    watcher = world.watcher()
    world.clock.advance(120)
    assert watcher.poll_once().actions == {}  # 120 s since the requeue, but held all along
    world.clock.advance(100)
    assert watcher.poll_once().actions == {}  # eligible 99 s
    world.clock.advance(1)
    assert watcher.poll_once().actions == {"fallback": 1}


def test_the_loop_speaks_systemds_notify_protocol(world, tmp_path):
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(0)
        env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
        ticks = Ticks()
        watcher = world.watcher(interval=5)
        stop = CountingStop(rounds=6)  # waits of at most 2 s (half the watchdog period) until 3 polls
        assert run(watcher, stop=stop, notifier=Notifier(environ=env, monotonic=ticks)) == 0
        messages = []
        while True:
            try:
                messages.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
    assert messages[0] == "WATCHDOG=1"  # from the first poll's Slurm calls
    assert messages[1:3] == ["READY=1", "STATUS=watching: 0 node(s) going away, last poll 2 Slurm queries"]
    assert messages[-1] == "STOPPING=1"
    assert max(stop.waits) <= 2.0


def test_a_watcher_that_gives_up_exits_non_zero_with_one_line(world, monkeypatch):
    from click.testing import CliRunner

    from slurm_preempt.cli import main
    from slurm_preempt.watch import settings as watchsettings

    world.slurm.fail_next("nodes", KeyError("pre1"), times=3)
    monkeypatch.setattr(watchsettings, "build", lambda *_a, **_k: world.watcher(interval=0.01, crash_after=3))
    result = CliRunner().invoke(main, ["watch", "--cluster"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith(
        "Error: 3 polls in a row failed with an unexpected error"
    )
    assert result.stderr.count("Traceback (most recent call last)") == 3  # each logged with its traceback
