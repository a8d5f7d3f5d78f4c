"""The watcher's decisions against an in-memory Slurm (tests/fakeslurm.py), with injected time.

What Slurm itself does is tested on the real cluster (test_watcher.py, test_watcher_cli.py); here every
rule of who is told what, when and how often, runs in milliseconds and without sleeping.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from fakeslurm import T0
from slurm_preempt import ledger
from slurm_preempt.errors import SlurmError
from slurm_preempt.watch.sources import Drain
from slurm_preempt.watch.watcher import state_path
from watchworld import GRACE, OPTED, REASON, ListSource, signalled

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
    # sinfo, squeue of the draining node, squeue of pending jobs; and, as events opened, one sinfo of
    # every node for the pools' sizes (the live preemption rate: at most every rate_pool_refresh)
    assert result.queries == 4
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
    assert signalled(world) == ["1", "2"]


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
    assert result.actions == {"notice_sent": 24, "signal_sent": 16} and result.queries == 4
    assert sorted(signalled(world)) == sorted(opted)  # in several scancel calls side by side, once each
    assert len(fake.called("signal_many")) > 1
    assert watcher.poll_once().actions == {}


def test_a_job_started_moments_ago_is_signalled_only_once_its_script_could_trap_it(world):
    """Measured on the cluster: USR1 34 ms after allocation killed the batch shell (WTERMSIG 10) before
    it installed its trap; the job ended COMPLETED and was never requeued. The notice is written at
    once, the signal waits for the first poll ``signal_after_start`` seconds after the job's start,
    and the deadline stays the drain's."""
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED, start_time=world.clock())  # allocated this second
    fake.add_job("2", ["pre1"], OPTED, start_time=world.clock() - timedelta(hours=1))
    watcher = world.watcher(signal_after_start=3.0)
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 2, "signal_sent": 1}
    assert signalled(world) == ["2"]
    assert world.notice("1").deadline == T0 + timedelta(seconds=GRACE)
    world.clock.advance(2)
    assert watcher.poll_once().actions == {} and signalled(world) == ["2"]  # 2 s old: not yet
    world.clock.advance(1)
    assert watcher.poll_once().actions == {"signal_sent": 1}
    assert signalled(world) == ["2", "1"] and fake.job("1").signals == ["USR1"]
    assert world.notice("1").deadline == T0 + timedelta(seconds=GRACE)  # the deadline did not move
    assert world.kinds("1") == ["notice_sent", "signal_sent"]
    calm = watcher.poll_once()
    assert calm.actions == {} and calm.queries == 2  # done: its node's jobs are not asked for again


def test_a_start_time_in_the_future_holds_a_signal_back_no_longer_than_the_margin(world):
    """The controller's clock far ahead of the watcher's must not hold a signal back for good."""
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED, start_time=world.clock() + timedelta(hours=9))
    watcher = world.watcher(signal_after_start=3.0)
    fake.drain(["pre1"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1}
    world.clock.advance(3)
    assert watcher.poll_once().actions == {"signal_sent": 1}


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


def test_a_job_that_shrank_in_place_is_told_of_a_survivors_drain_and_never_again_of_the_node_it_left(
    world,
):
    """A job that gave pre3 back (job/shrink.py) runs on in the same attempt on pre1 and pre2: the
    watcher must not tell it again for pre3, nor take pre2's drain for news it already had."""
    fake = world.slurm
    fake.add_job("1", ["pre1", "pre2", "pre3"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre3"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    fake.job("1").nodes = ("pre1", "pre2")  # shrunk: same attempt, pre3 still draining
    world.clock.advance(5)
    assert watcher.poll_once().actions == {} and fake.job("1").signals == ["USR1"]
    world.clock.advance(25)
    fake.drain(["pre2"], REASON)
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert world.notice("1").node == "pre2" and fake.job("1").signals == ["USR1", "USR1"]
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


@dataclass
class AckingSource(ListSource):
    """A source that wants to hear which nodes' jobs were all told (Azure's StartRequests)."""

    told_nodes: list[set[str]] = field(default_factory=list)

    def told(self, nodes: set[str]) -> None:
        self.told_nodes.append(set(nodes))


def test_a_source_hears_of_a_node_only_once_every_job_on_it_was_told(world):
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    provider = AckingSource(name="azure")
    watcher = world.watcher(job_id="1", sources=[provider])
    watcher.poll_once()
    assert provider.told_nodes == []  # nothing going away
    provider.drains = [Drain("pre1", "Azure Preempt event e1", world.clock(), "azure", 30.0)]
    fake.fail_next("signal_many")  # the signal did not go: not yet told
    watcher.poll_once()
    assert provider.told_nodes == []
    assert watcher.poll_once().actions == {"signal_sent": 1}
    assert provider.told_nodes == [{"pre1"}] and world.notice("1").source == "azure"


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
    assert signalled(world) == ["1", "2", "3", "2"]
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
    world.clock.advance(2)
    first = watcher.poll_once()
    assert first.actions == {"fast_restart": 1}
    assert fake.called("update_job") == [{"job_id": "1", "starttime": "now"}]
    fake.job("1").reason = "BeginTime"  # still COMPLETING: Slurm accepted it but it did not take
    assert watcher.poll_once().actions == {}  # sent again, recorded once per restart
    assert fake.called("update_job")[-1] == {"job_id": "1", "starttime": "now"}
    assert world.kinds("1").count("fast_restart") == 1
    assert "fast_restart" not in world.kinds("2") and "fast_restart" not in world.kinds("3")
    assert {c["job_id"] for c in fake.called("update_job")} == {"1"}


def test_fast_restart_waits_for_the_requeues_second_to_pass(world):
    """A two-node job told to leave pre1 also leaves pre2, which stays: started again there within the
    second of its requeue, slurmd would refuse the launch ("Job credential revoked") and the job would
    end FAILED (seen on 22.05 with an elastic --nodes=1-2 job)."""
    fake = world.slurm
    fake.add_job("1", ["pre1", "pre2"], OPTED)
    watcher = world.watcher()
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    world.clock.advance(0.9)
    fake.requeue_by_job("1")  # SubmitTime: the requeue's whole second, 0.9 s ago
    world.clock.advance(0.5)
    assert watcher.poll_once().actions == {} and fake.called("update_job") == []
    world.clock.advance(0.1)
    assert watcher.poll_once().actions == {"fast_restart": 1}
    fake.job("1").submit_time = None  # a SubmitTime Slurm did not give: Slurm's own hold stays
    fake.job("1").restart_count += 1
    world.clock.advance(60)
    assert watcher.poll_once().actions == {}


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
    assert signalled(world) == ["7"] and world.notice("8") is None
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
    assert watcher.poll_once().actions == {"enforced_requeue": 1, "fallback": 1}
    world.clock.advance(2)  # past the requeue's second
    assert watcher.poll_once().actions == {"fast_restart": 1}
    assert [fake.job(j).state for j in tasks] == ["PENDING", "RUNNING", "RUNNING"]
    assert fake.called("signal_many")[0]["job_ids"] == ("100_0",)
    assert fake.called("requeue") == [{"job_id": "100_0"}]
    assert fake.called("update_job") == [
        {"job_id": "100_0", "features": "standard"},
        {"job_id": "100_0", "starttime": "now"},
    ]
    kinds = ["notice_sent", "signal_sent", "enforced_requeue", "fallback", "fast_restart"]
    assert world.kinds("100") == kinds


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
    assert signalled(world) == ["1"] and world.notice("2") is None
    assert state_path(world.state_dir, user="alice").exists()
    fake.requeue_by_job("1")
    world.clock.advance(2)
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


def test_a_state_file_of_another_user_is_not_believed(world, caplog):
    """It could say that every job was told: a watcher would then tell none."""
    world.slurm.add_job("1", ["pre1"], OPTED)
    world.slurm.drain(["pre1"], REASON)
    path = state_path(world.state_dir)
    path.parent.mkdir(parents=True)
    planted = {
        "version": 2,
        "events": {},
        "told": {"1|pre1": {"event_id": "x", "notice": "x", "signal": "x"}},
    }
    path.write_text(json.dumps(planted))
    os.chown(path, 65534, 65534)
    assert world.watcher().poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    assert any("belongs to uid 65534" in r.getMessage() for r in caplog.records)
