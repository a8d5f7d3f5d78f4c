"""Which notice belongs to this attempt: identities first, clocks last, node clocks skewed +-30 s."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest

from slurm_preempt import procinfo
from slurm_preempt.job import environment
from slurm_preempt.job.environment import NOTICE_SKEW, JobEnv, fresh_notice, job_start_time
from slurm_preempt.notice import Notice, write_notice

# This attempt started at START by the controller's clock; its node's clock is off by SKEW seconds.
START = datetime(2026, 12, 1, 6, 0, 0, tzinfo=timezone.utc)
SKEWS = [-30, -5, 0, 5, 30]
GRACE = 300


def _env(tmp_path, skew: float, restart_count: int = 1, slurm_start: bool = False) -> JobEnv:
    return JobEnv(
        job_id="123",
        restart_count=restart_count,
        notice_file=tmp_path / "notice.json",
        start_time=START + timedelta(seconds=skew),
        slurm_start_time=START if slurm_start else None,
    )


def _notice(tmp_path, drain_offset: float, restart_count: int | None, node: str = "pre1") -> Notice:
    notice = Notice.for_drain(
        "123",
        node,
        "reclaimed",
        "slurm",
        START + timedelta(seconds=drain_offset),
        GRACE,
        restart_count=restart_count,
    )
    write_notice(tmp_path / "notice.json", notice)
    return notice


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("drain_offset", [0, 1, 10, 120, 3600])
@pytest.mark.parametrize("named", [True, False])
def test_every_real_notice_is_acted_on_whatever_the_node_clock(tmp_path, skew, drain_offset, named):
    """A drain after this attempt started (by the controller's clock) is for this attempt."""
    notice = _notice(tmp_path, drain_offset, restart_count=1 if named else None)
    found = fresh_notice(_env(tmp_path, skew), handled=set())
    assert found is not None and found.event_id == notice.event_id


@pytest.mark.parametrize("skew", SKEWS)
def test_a_provider_event_just_before_the_start_is_still_acted_on(tmp_path, skew):
    """A provider's event time can precede the drain (a watcher poll later); a job that started on the
    node in between is on a node going away."""
    _notice(tmp_path, drain_offset=-5, restart_count=None)
    assert fresh_notice(_env(tmp_path, skew), handled=set()) is not None


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("drain_offset", [-GRACE - 5, -2 * GRACE, -86400])
def test_no_stale_notice_of_an_earlier_attempt_is_acted_on(tmp_path, skew, drain_offset):
    """Without an attempt number: the node was drained, removed after the grace and came back before
    this attempt could start on it, so the drain is at least the grace older than the start."""
    _notice(tmp_path, drain_offset, restart_count=None)
    assert fresh_notice(_env(tmp_path, skew), handled=set()) is None


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("drain_offset", [-GRACE, -3, 0, 3, 600])
def test_a_notice_naming_an_earlier_attempt_is_stale_whatever_the_clocks(tmp_path, skew, drain_offset):
    """The watcher wrote restart count 0 into it; we are restart 1: not ours, even with a drain time
    that looks recent on our clock (a fast restart three seconds after the drain)."""
    _notice(tmp_path, drain_offset, restart_count=0)
    assert fresh_notice(_env(tmp_path, skew, restart_count=1), handled=set()) is None


@pytest.mark.parametrize("skew", SKEWS)
def test_an_event_handled_by_an_earlier_attempt_is_stale(tmp_path, skew):
    notice = _notice(tmp_path, drain_offset=2, restart_count=None)
    assert fresh_notice(_env(tmp_path, skew), handled={notice.event_id}) is None


def test_a_notice_naming_this_attempt_wins_over_the_clock(tmp_path):
    """Our restart count in the notice: ours, even when the clocks are hours apart."""
    _notice(tmp_path, drain_offset=-7200, restart_count=1)
    assert fresh_notice(_env(tmp_path, 0, restart_count=1), handled=set()) is not None


def test_a_higher_count_than_ours_falls_back_to_the_clock(tmp_path):
    """SLURM_RESTART_COUNT lost (a container that strips the environment): judge by the clock."""
    _notice(tmp_path, drain_offset=5, restart_count=3)
    assert fresh_notice(_env(tmp_path, 0, restart_count=0), handled=set()) is not None
    _notice(tmp_path, drain_offset=-GRACE - 5, restart_count=3)
    assert fresh_notice(_env(tmp_path, 0, restart_count=0), handled=set()) is None


@pytest.mark.parametrize("skew", [-3600, 3600])
def test_slurms_own_start_time_makes_the_node_clock_irrelevant(tmp_path, skew):
    _notice(tmp_path, drain_offset=1, restart_count=None)
    assert fresh_notice(_env(tmp_path, skew, slurm_start=True), handled=set()) is not None
    _notice(tmp_path, drain_offset=-NOTICE_SKEW - 10, restart_count=None)
    assert fresh_notice(_env(tmp_path, skew, slurm_start=True), handled=set()) is None


def test_slurm_job_start_time_is_read_from_the_environment():
    env = JobEnv.from_environ({"SLURM_JOB_ID": "5", "SLURM_JOB_START_TIME": "1764568800"})
    assert env.slurm_start_time == datetime(2025, 12, 1, 6, 0, tzinfo=timezone.utc)
    assert JobEnv.from_environ({"SLURM_JOB_START_TIME": "soon"}).slurm_start_time is None


def test_the_attempt_number_survives_the_notice_file(tmp_path):
    _notice(tmp_path, drain_offset=1, restart_count=4)
    found = fresh_notice(_env(tmp_path, 0, restart_count=4), handled=set())
    assert found.restart_count == 4
    assert "restart_count" in (tmp_path / "notice.json").read_text()


# ---------------------------------------------------------------------------------------- job start


def _table(monkeypatch, rows: dict[int, tuple[str, int, int] | None]) -> None:
    """Processes as /proc would show them: pid -> (comm, ppid, start tick); None: gone."""
    me = os.getpid()

    def read(pid: int) -> procinfo.Stat | None:
        row = rows.get(me if pid == me else pid)
        return None if row is None else procinfo.Stat(pid, row[0], "S", row[1], row[2])

    monkeypatch.setattr(procinfo, "read", read)


def test_the_job_started_when_the_batch_script_below_slurmstepd_did(monkeypatch):
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    # slurmstepd (40) -> the batch script (50) -> a wrapper (60) -> this process
    stepd = ("slurmstepd: [1.batch]", 1, 100 * tick)
    _table(
        monkeypatch,
        {me: ("python", 60, 300 * tick), 60: ("sh", 50, 250 * tick), 50: ("bash", 40, 200 * tick), 40: stepd},
    )
    booted = environment.boot_time()
    assert booted is not None
    monkeypatch.setattr(environment, "boot_time", lambda: booted)  # one boot time for both readings
    under_slurm = job_start_time()
    _table(monkeypatch, {me: ("python", 60, 300 * tick), 60: ("bash", 1, 200 * tick)})
    alone = job_start_time()  # not under slurmstepd: this process's own start
    assert under_slurm == datetime.fromtimestamp(booted + 200, timezone.utc)
    assert alone == datetime.fromtimestamp(booted + 300, timezone.utc)


def test_the_job_start_is_unknown_without_proc_or_when_an_ancestor_vanished(monkeypatch):
    tick = os.sysconf("SC_CLK_TCK")
    _table(monkeypatch, {})
    assert job_start_time() is None  # no /proc
    _table(monkeypatch, {os.getpid(): ("python", 60, 300 * tick), 60: None})
    assert job_start_time() is None  # its parent exited while it looked
