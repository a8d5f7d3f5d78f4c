"""The watcher's loop (watch/loop.py): back-off, crash semantics, systemd's notify protocol; against the
in-memory Slurm, with a stop event that never sleeps."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from slurm_preempt.errors import WatcherError
from slurm_preempt.watch.loop import run
from slurm_preempt.watch.sdnotify import Notifier
from watchworld import OPTED, REASON, Ticks

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
        "queries": 4,  # with the pools' sizes for the live rate
        "draining": ["pre1"],
        "new_events": ["pre1"],
        "actions": {"notice_sent": 1, "signal_sent": 1},
        "job_ended": False,
        "standby": False,
    }


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
