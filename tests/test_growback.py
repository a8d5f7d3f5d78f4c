"""watch/growback.py: when a job below its MAX nodes is told to requeue and come back larger (a pure
decision fed records and a clock), and the watcher telling it once, through the notice path, then
releasing its requeue at once (fake Slurm, injected clock). The drill on a real cluster is
tests/test_growback_cluster.py."""

from __future__ import annotations

import logging
from datetime import timedelta

from fakeslurm import T0
from slurm_preempt import ledger, optin
from slurm_preempt.notice import GROW_BACK_SOURCE
from slurm_preempt.records import history, texts
from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.watch.growback import decide, idle_for, matches, refused_tokens, window_of
from watchworld import OPTED

WISH = optin.parse(f"{OPTED} slurm-preempt:grow-back=600 slurm-preempt:max-nodes=3")
HOUR = timedelta(hours=1)


def running(nodes=("pre1", "pre2"), **fields) -> Job:
    values = {"start_time": T0 - HOUR, "features": "preemptible", "partition": "batch", **fields}
    return Job("7", "RUNNING", nodes=tuple(nodes), num_nodes=len(nodes), **values)


def grow(job=None, wish=WISH, idle=("pre3",), last=None, now=T0, busy=""):
    return decide(job or running(), wish, idle, last, now, window=600, busy=busy)


def test_a_job_below_its_max_grows_when_a_matching_node_is_idle():
    decision = grow(idle=("pre3", "pre4"))
    assert decision.grow and decision.target == 3 and decision.idle == ("pre3",)
    assert grow(job=running(("pre1",)), idle=("pre3", "pre4")).target == 3  # MAX, not more


def test_it_never_grows_against_the_rules():
    assert "at most 3" in grow(job=running(("pre1", "pre2", "pre3"))).why_not  # at MAX
    assert "no idle node" in grow(idle=()).why_not
    assert grow(busy="a notice is open for it").why_not == "a notice is open for it"
    assert "not opted in" in grow(wish=optin.parse(OPTED)).why_not
    no_signal = optin.parse("slurm-preempt:signal=none slurm-preempt:grow-back=600 slurm-preempt:max-nodes=3")
    assert not grow(wish=no_signal).grow  # nothing could tell its script
    assert not grow(wish=optin.parse(f"{OPTED} slurm-preempt:grow-back=600")).grow  # MAX unknown
    assert not grow(job=Job("7", "PENDING", num_nodes=2)).grow
    moving = optin.parse(f"{WISH.to_comment()} slurm-preempt:fallback-after=2")
    assert "fallback-after" in grow(job=running(restart_count=1), wish=moving).why_not


def test_once_per_window_counted_from_the_last_grow_back_or_the_attempts_start():
    assert "within its window" in grow(last=T0 - timedelta(seconds=599)).why_not
    assert grow(last=T0 - timedelta(seconds=600)).grow
    young = running(start_time=T0 - timedelta(seconds=30))  # started smaller just now: let it work first
    assert "within its window" in grow(job=young).why_not
    assert window_of(WISH, 900) == 900 and window_of(WISH, 60) == 600  # the watcher's floor wins


def test_constraints_it_can_judge_and_those_it_leaves_alone():
    assert matches("", ()) and matches("preemptible", ("preemptible", "gpu"))
    assert matches("preemptible&gpu", ("preemptible", "gpu")) and not matches("preemptible&gpu", ("gpu",))
    assert matches("a|b", ("b",)) and not matches("a|b", ("c",))
    for rich in ("[a|b]", "a*2", "a&b|c", "a,b", "a b"):
        assert matches(rich, ("a", "b", "c")) is None
    job = running(features="preemptible")
    nodes = [
        Node("pre1", "IDLE", features=("preemptible",)),  # its own
        Node("pre3", "IDLE", features=("preemptible",)),
        Node("pre4", "IDLE", frozenset({"DRAIN"}), ("preemptible",)),
        Node("std1", "IDLE", features=("standard",)),
        Node("pre5", "MIXED", features=("preemptible",)),
    ]
    assert idle_for(job, nodes) == ("pre3",)
    assert idle_for(running(features="[a|b]"), nodes) == ()  # not judged: never told on a guess


def test_forged_tokens_are_ignored_and_named():
    for value in ("²", "٣", "1²", "9" * 5000, "-3", "0", "", "1e9", "0x10"):
        comment = f"{OPTED} slurm-preempt:grow-back={value} slurm-preempt:max-nodes={value}"
        wish = optin.parse(comment)
        assert wish.grow_back is None and wish.max_nodes is None
        assert len(refused_tokens(comment)) == 2
    assert optin.parse(f"{OPTED} slurm-preempt:max-nodes=100001").max_nodes is None  # past any cluster
    assert refused_tokens("slurm-preempt:grow-back=\x1b[2J") == ["grow-back='\\x1b[2J'"]  # logged escaped
    assert optin.parse(WISH.to_comment()) == WISH and refused_tokens(WISH.to_comment()) == []


# ---------------------------------------------------------------------------------------- the watcher

COMMENT = WISH.to_comment()


def _running_queries(world) -> int:
    return len([c for c in world.slurm.called("jobs") if c["states"] == "running"])


def _grow_records(world, job_id="7"):
    return [e for e in ledger.events(world.state_dir, job_id) if e["kind"] == "grow_back"]


def test_the_watcher_tells_a_shrunk_job_once_then_releases_its_requeue_at_once(world):
    world.slurm.add_job("7", ["pre1", "pre2"], COMMENT, features="preemptible", start_time=T0 - HOUR)
    hook = {"restart_count": 0, "node": "pre1"}
    ledger.record(world.state_dir, "7", "attempt_start", "hook", **hook)
    watcher = world.watcher(grow_back=True, grow_back_min_window=60, grow_back_every=5)
    watcher.poll_once()
    [record] = _grow_records(world)
    assert record["num_nodes_before"] == 2 and record["nodes"] == 3 and record["restart_count"] == 0
    notice = world.notice("7")
    assert notice is not None and notice.source == GROW_BACK_SOURCE and notice.restart_count == 0
    assert "2 -> 3 nodes" in notice.reason
    assert world.slurm.job("7").signals == ["USR1"]
    for _ in range(5):  # still running on 2 while it checkpoints: never told twice in its window
        world.clock.advance(10)
        watcher.poll_once()
    assert world.slurm.job("7").signals == ["USR1"] and len(_grow_records(world)) == 1
    # It requeued itself: no node it left is going away, so its hold is released at once.
    ledger.record(world.state_dir, "7", "requeued", "job", attempt=1, how="scontrol requeue")
    ledger.record(world.state_dir, "7", "attempt_end", "hook", hook="epilog", **hook)
    job = world.slurm.job("7")
    job.state, job.nodes, job.restart_count, job.reason = "PENDING", (), 1, "BeginTime"
    job.submit_time = world.clock()
    world.clock.advance(2)
    watcher.poll_once()
    assert {"job_id": "7", "starttime": "now"} in world.slurm.called("update_job")
    ledger.record(world.state_dir, "7", "attempt_start", "hook", restart_count=1, node="pre1")
    text = texts.history_text(history.from_ledger("7", world.state_dir, None))
    assert "grown back: 2 -> 3 nodes" in text


def test_the_watcher_leaves_alone_what_it_must(world, caplog):
    world.slurm.add_job("7", ["pre1", "pre2"], COMMENT, features="preemptible", start_time=T0 - HOUR)
    off = world.watcher()  # grow_back = false: the default
    off.poll_once()
    assert _grow_records(world) == []
    assert not any(c.get("states") == "idle" for c in world.slurm.called("nodes"))
    world.slurm.drain(["pre2"], "maintenance")  # any drain of its nodes, counted or not: never
    watcher = world.watcher(grow_back=True, grow_back_min_window=60, grow_back_every=5)
    watcher.poll_once()
    assert _grow_records(world) == [] and world.notice("7").source != GROW_BACK_SOURCE  # told of the drain
    world.slurm.resume(["pre2"])
    others = ["pre3", "pre4", "std1", "std2"]
    world.slurm.drain(others, "maintenance")  # no idle node: squeue is not even asked
    world.clock.advance(10)
    watcher.poll_once()
    assert _grow_records(world) == [] and _running_queries(world) == 1  # the poll before, with pre3 idle
    world.slurm.resume(others)
    forged = f"{OPTED} slurm-preempt:grow-back=² slurm-preempt:max-nodes=99999999999"
    world.slurm.add_job("8", ["pre3"], forged, features="preemptible", start_time=T0 - HOUR)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            world.clock.advance(10)
            watcher.poll_once()
    assert _grow_records(world, "8") == [] and world.slurm.job("8").signals == []
    assert len([r for r in caplog.records if "grow-back token(s) ignored" in r.getMessage()]) == 1


def test_a_pending_job_that_outranks_it_holds_it_back_until_it_goes(world, caplog):
    """Told, it would be requeued and compete again for the nodes it frees: a pending job of its
    partition with a priority at least its own would take them. Held ones, lower ones: no matter."""
    world.slurm.add_job("7", ["pre1", "pre2"], COMMENT, features="preemptible", start_time=T0 - HOUR)
    world.slurm.add_job("9", [], "", priority=500)  # lower: no matter
    world.slurm.add_job("10", [], "", priority=5000, reason="JobHeldUser")  # held: no matter
    rival = world.slurm.add_job("11", [], "", priority=1000, reason="Resources")  # equal: it waits
    watcher = world.watcher(grow_back=True, grow_back_min_window=60, grow_back_every=5)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            watcher.poll_once()
            world.clock.advance(10)
    assert _grow_records(world) == [] and world.slurm.job("7").signals == []
    held = [r.getMessage() for r in caplog.records if "no grow-back while" in r.getMessage()]
    assert held == ["job 7: no grow-back while pending job 11 (priority 1000, at least its own 1000) in"
                    " partition batch could take the nodes it would free"]  # fmt: skip
    rival.priority = 999  # one below: it may grow
    watcher.poll_once()
    assert len(_grow_records(world)) == 1 and world.slurm.job("7").signals == ["USR1"]


def test_an_unread_queue_holds_it_back_this_look(world):
    world.slurm.add_job("7", ["pre1", "pre2"], COMMENT, features="preemptible", start_time=T0 - HOUR)
    watcher = world.watcher(grow_back=True, grow_back_min_window=60, grow_back_every=5)
    world.slurm.fail_next("queue")
    watcher.poll_once()
    assert _grow_records(world) == []
    world.clock.advance(10)
    watcher.poll_once()
    assert len(_grow_records(world)) == 1
