"""Records before acts, and what a watcher killed between intent, act and confirm leaves to the next one
(the same one restarted, or the standby of a pair); against the in-memory Slurm, with injected clocks.
The same with real processes on the real cluster: test_watcher_pair.py."""

from __future__ import annotations

import logging

import pytest

from slurm_preempt.watch import launchhold
from slurm_preempt.watch.outbox import Outbox
from watchworld import OPTED, REASON, Killed, Ticks, signalled

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
    assert sorted(signalled(world)) == sorted(j for j in ids if fake.job(j).nodes[0] != "pre4")
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
    assert signalled(world) == [] and all(world.notice(j) for j in ids)
    b_ticks.now += 30
    took_over = b.poll_once()
    assert took_over.actions == {"signal_sent": 12}  # the leftover intents, claimed and sent
    assert sorted(signalled(world)) == sorted(ids)
    assert all(world.kinds(j) == ["notice_sent", "signal_sent"] for j in ids)
    assert b.poll_once().actions == {} and len(signalled(world)) == 12


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
    assert sorted(signalled(world)) == sorted(ids)
    b_ticks.now += 30
    assert b.poll_once().actions == {"signal_sent": 12}  # confirmed from the outcome files, not sent
    assert len(signalled(world)) == 12
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


# ---------------------------------------------------------------------------------------- the state on disk


def test_an_enforced_requeue_is_in_the_state_before_the_watcher_goes_on(world, monkeypatch):
    """Bug: the enforcement's save ran before anything said the state had changed (the flag was set
    after it), so a watcher killed after an enforced requeue, at the pending-jobs query that follows,
    left no trace of it on disk: a restarted one took the event for not enforced."""
    fake = world.slurm
    fake.add_job("1", ["pre1"], OPTED)
    settings = {"grace": 60, "enforce": True, "enforce_margin": 10}
    watcher = world.watcher(**settings)
    fake.drain(["pre1"], REASON)
    watcher.poll_once()
    world.clock.advance(50)
    asked = fake.jobs

    def killed_at_the_pending_query(**query):
        if query.get("states") == launchhold.PENDING_STATES:
            raise Killed
        return asked(**query)

    monkeypatch.setattr(fake, "jobs", killed_at_the_pending_query)
    with pytest.raises(Killed):
        watcher.poll_once()
    assert fake.called("requeue") == [{"job_id": "1"}]
    restarted = world.watcher(**settings)
    assert restarted.sent.done("1", "pre1", "enforced") and restarted.sent.events["pre1"].enforced


def test_a_job_moved_after_a_failed_launch_is_known_to_the_next_watcher(world):
    """Bug: that the job was moved and released was noted after the state's last save of the poll, so
    it never reached the disk: a restarted watcher left the job to Slurm's ~2 min requeue hold, though
    no node it waits for had revoked its credential."""
    fake = world.slurm
    fake.add_job("7", comment=OPTED, reason=launchhold.LAUNCH_FAILED, restart_count=1, features="preemptible")
    world.watcher().poll_once()
    assert fake.called("release") == [{"job_id": "7"}]
    assert fake.job("7").features == "standard"
    fake.job("7").reason = "BeginTime"  # still completing: the start time did not take
    before = len(fake.called("update_job"))
    world.watcher().poll_once()
    assert fake.called("update_job")[before:] == [{"job_id": "7", "starttime": "now"}]
    assert len(fake.called("release")) == 1


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to make files of another owner")
def test_a_state_file_of_another_user_is_not_believed_on_taking_over(world, caplog):
    """Issue 28 item 7: the standby loads the shared state when it takes over, with the owner check it
    makes at start; a state another user put in its place (saying every job was told) is ignored."""
    import json
    import os

    from hostileusers import MALLORY, ensure_user
    from slurm_preempt.watch.watcher import state_path

    fake = world.slurm
    ids = _jobs_on_every_node(fake, 4)
    a_ticks, b_ticks = Ticks(), Ticks()
    a, b = world.pair_member("hostA", a_ticks), world.pair_member("hostB", b_ticks)
    a.poll_once()
    assert b.poll_once().standby
    path = state_path(world.state_dir)
    forged = json.loads(path.read_text())
    forged["told"] = {f"{j}|{fake.job(j).nodes[0]}": {"event_id": "x", "notice": "2026-01-01T00:00:00Z",
                      "signal": "2026-01-01T00:00:00Z"} for j in ids}  # fmt: skip
    path.write_text(json.dumps(forged))
    mallory, _ = ensure_user(MALLORY)
    os.chown(path, mallory, mallory)
    b_ticks.now += 30  # A is gone
    fake.drain(["pre1"], REASON)
    with caplog.at_level(logging.WARNING):
        took_over = b.poll_once()
    assert not took_over.standby and took_over.actions.get("signal_sent") == 1  # the job on pre1
    assert any("not to us" in r.getMessage() for r in caplog.records)
