"""Lead time per notice source, from ledger events as the watcher and the job write them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from slurm_preempt.notice import to_text
from slurm_preempt.records import history, leadtime
from slurm_preempt.records.attempts import Attempt, JobHistory

T0 = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _hook(kind: str, seconds: float) -> dict:
    """A prolog's or epilog's event (root's: trusted)."""
    return {
        "kind": kind,
        "time": to_text(_at(seconds)),
        "restart_count": 0,
        "nodes": "pre1",
        "_trusted": True,
    }


def _attempt(number, given, end, source="slurm", final=None) -> Attempt:
    attempt = Attempt(number, ["pre1"], start=_at(0), end=_at(end), cause="node failure (preempted)")
    attempt.notice_given, attempt.notice_source = (_at(given) if given is not None else None), source
    attempt.final_checkpoints = [_at(final)] if final is not None else []
    return attempt


def test_a_notice_event_gives_its_attempt_the_source_and_the_time_it_was_given():
    events = [
        _hook("attempt_start", 0),
        {"kind": "notice_sent", "time": to_text(_at(10)), "source_kind": "azure",
         "event_id": f"pre1@{to_text(_at(8))}", "deadline": to_text(_at(38))},
        {"kind": "notice_sent", "time": to_text(_at(12)), "source_kind": "slurm"},  # a later one: kept first
        {"kind": "checkpoint_saved", "time": to_text(_at(20)), "final": True},
        _hook("attempt_end", 38),
    ]  # fmt: skip
    found = history.build("5", events)
    attempt = found.attempts[0]
    assert (attempt.notice_source, attempt.notice_given) == ("azure", _at(10))
    lead = leadtime.attempt_lead(attempt)
    assert lead == leadtime.Lead("azure", 28.0, True)


def test_a_source_the_watcher_does_not_know_is_other():
    events = [
        _hook("attempt_start", 0),
        {"kind": "notice_sent", "time": to_text(_at(10)), "source_kind": "<b>a user's words</b>"},
    ]  # fmt: skip
    assert history.build("5", events).attempts[0].notice_source == "other"


def test_per_source_median_worst_and_final_checkpoints_inside():
    jobs = [
        JobHistory("1", attempts=[_attempt(0, 10, 310, final=300), _attempt(1, None, 400)]),
        JobHistory("2", attempts=[_attempt(0, 10, 250, final=260)]),  # saved after the end: not inside
        JobHistory(
            "3", attempts=[_attempt(0, 5, 35, source="gcp", final=30), _attempt(1, 5, 25, source="gcp")]
        ),
        JobHistory("4", attempts=[_attempt(0, 50, 40)]),  # an end before the notice: no lead
    ]
    rows = leadtime.by_source(leadtime.leads_of(jobs))
    assert [r.to_json() for r in rows] == [
        {"source": "gcp", "notices": 2, "median_seconds": 25.0, "worst_seconds": 20.0,
         "final_checkpoints_inside": 1},
        {"source": "slurm", "notices": 2, "median_seconds": 270.0, "worst_seconds": 240.0,
         "final_checkpoints_inside": 1},
    ]  # fmt: skip
    text = "\n".join(leadtime.lead_lines(rows))
    assert "gcp" in text and "4m30s" in text and "1/2" in text
    assert leadtime.lead_lines([]) == []


def test_a_checkpoint_longer_than_half_the_lead_time_is_warned_of():
    assert leadtime.checkpoint_warning(14.0, 30.0, "azure") is None
    warning = leadtime.checkpoint_warning(16.0, 30.0, "azure")
    assert warning is not None and "16s" in warning and "30s a notice from azure gives" in warning
    assert leadtime.checkpoint_warning(5.0, 0.0, "slurm") is None
