"""NoticeWatch: the notice file re-read on its poll (time injected) or at once after a signal; the
deadline from the notice, else from the signal; stale events ignored."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from slurm_preempt.job.environment import JobEnv
from slurm_preempt.job.noticewatch import NoticeWatch
from slurm_preempt.notice import Notice, read_notice, utcnow, write_notice


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(tmp_path, handled=None, poll=5.0, clock=None):
    env = JobEnv(job_id="7", notice_file=tmp_path / "7.json", start_time=utcnow() - timedelta(seconds=60))
    return NoticeWatch(
        env, set() if handled is None else handled, notice_poll=poll, deadline_after_signal=30,
        clock=clock or Clock(),
    )  # fmt: skip


def _notice(tmp_path, node="pre1", reason="reclaimed") -> Notice:
    notice = Notice.for_drain("7", node, reason, "slurm", utcnow(), 120)
    write_notice(tmp_path / "7.json", notice)
    return read_notice(tmp_path / "7.json")  # as written (times to the second)


def test_no_notice_no_signal_knows_nothing(tmp_path):
    watch = _watch(tmp_path)
    assert (watch.notice, watch.notified, watch.deadline, watch.seconds_left) == (None, False, None, None)
    assert watch.cause() == "another rank" and watch.event_acted_on() == set()


def test_the_file_is_read_again_only_when_its_poll_is_due(tmp_path):
    clock = Clock()
    watch = _watch(tmp_path, clock=clock)
    assert watch.notice is None  # read now: nothing there
    written = _notice(tmp_path)
    clock.now += 4.9
    assert watch.notice is None  # not due yet: the answer read before
    clock.now += 0.1
    assert watch.notice == written and watch.notified
    assert watch.deadline == written.deadline
    assert watch.cause() == "node pre1: reclaimed" and watch.event_acted_on() == {written.event_id}


def test_a_signal_makes_the_next_look_read_the_file_at_once(tmp_path):
    watch = _watch(tmp_path)
    assert watch.notice is None
    written = _notice(tmp_path)
    watch.reread()  # what the signal handler calls
    assert watch.notice == written


def test_the_deadline_of_a_signal_alone_is_its_time_plus_the_setting(tmp_path):
    watch = _watch(tmp_path)
    watch.signals.at, watch.signals.name = time.time(), "SIGUSR1"
    deadline = watch.deadline
    assert deadline is not None and watch.notified and watch.cause() == "SIGUSR1"
    expected = datetime.fromtimestamp(watch.signals.at, timezone.utc) + timedelta(seconds=30)
    assert abs((deadline - expected).total_seconds()) < 1
    left = watch.seconds_left
    assert left is not None and 0 < left <= 30


def test_an_event_an_earlier_attempt_acted_on_is_stale(tmp_path):
    handled: set[str] = set()
    watch = _watch(tmp_path, handled=handled)
    written = _notice(tmp_path)
    handled.add(written.event_id)  # shared: the caller learns it from the checkpoint it resumes
    watch.reread()
    assert watch.notice is None and not watch.notified
