"""The lease two watchers of one state share: exactly one acts, the other takes over when it dies.

Time is injected (each lease reads its own monotonic clock, as on two hosts); nothing sleeps. The real
two-process test, SIGKILL in the middle of a mass drain on the local cluster, is in test_watcher_pair.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_preempt import procinfo
from slurm_preempt.watch.lease import Lease


class Ticks:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _dead_pid() -> int:
    """A pid that was a process of this host and is no more."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def state(tmp_path):
    return tmp_path / "watcher" / "sent.json"


def test_first_comer_holds_the_other_stands_by(state):
    a_clock, b_clock = Ticks(), Ticks()
    a = Lease(state, ttl=30, monotonic=a_clock, host="hostA", pid=11)
    b = Lease(state, ttl=30, monotonic=b_clock, host="hostB", pid=22)
    assert a.hold() and not b.hold()
    assert a.still_mine() and not b.still_mine()
    assert b.holder().startswith("hostA:11:")
    for _ in range(20):  # A beats; B, however long it looks, never takes over
        a_clock.now += 10
        b_clock.now += 10
        a.renew()
        assert a.hold() and not b.hold()


def test_the_standby_takes_over_after_ttl_of_silence_on_its_own_clock(state):
    a_clock, b_clock = Ticks(), Ticks()
    b_clock.now = -5e6  # another host's clock: never compared with A's
    a = Lease(state, ttl=30, monotonic=a_clock, host="hostA", pid=11)
    b = Lease(state, ttl=30, monotonic=b_clock, host="hostB", pid=22)
    assert a.hold() and not b.hold()
    b_clock.now += 29  # A died (on another host: no pid to look at) right after its last beat
    assert not b.hold()
    b_clock.now += 1
    assert b.hold() and b.term == 2
    assert not a.still_mine()  # A wakes up (it was only paused): deposed, it must not act
    assert not a.hold() and a.term is None
    assert sorted(p.name for p in a.folder.iterdir()) == ["2"]


def test_of_two_standbys_taking_over_at_once_exactly_one_wins(state):
    clocks = [Ticks() for _ in range(3)]
    a, b, c = (Lease(state, ttl=5, monotonic=clk, host=f"h{i}", pid=i + 1) for i, clk in enumerate(clocks))
    assert a.hold()
    assert not b.hold() and not c.hold()
    clocks[1].now += 5
    clocks[2].now += 5
    outcomes = [b.hold(), c.hold()]
    assert outcomes == [True, False] and b.term == 2
    assert c.holder().startswith("h1:")


def test_a_crashed_holder_on_this_host_is_replaced_at_once(state):
    dead = Lease(state, ttl=300, host="here", pid=_dead_pid())
    assert dead.hold()
    assert Lease(state, ttl=300, host="here").hold()  # no 300 s wait: that process is gone


def test_without_proc_a_holder_on_this_host_is_waited_for(state, monkeypatch):
    dead = Lease(state, ttl=300, host="here", pid=_dead_pid())
    assert dead.hold()
    monkeypatch.setattr(procinfo, "read", lambda _pid: None)  # no /proc: whether it lives is unknown
    assert not Lease(state, ttl=300, host="here").hold()


def test_a_live_holder_on_this_host_is_not_replaced(state):
    assert Lease(state, ttl=300, host="here").hold()  # this very process
    assert not Lease(state, ttl=300, host="here").hold()


def test_a_released_lease_is_taken_at_once(state):
    a = Lease(state, ttl=300, host="hostA", pid=11)
    b = Lease(state, ttl=300, host="hostB", pid=22)
    assert a.hold() and not b.hold()
    a.release()
    assert b.hold() and not a.still_mine()


def test_beats_are_rate_limited_and_change_the_file(state):
    clock = Ticks()
    a = Lease(state, ttl=20, monotonic=clock, host="hostA", pid=11)
    a.hold()
    path = a.folder / "1"
    first = json.loads(path.read_text())["beat"]
    clock.now += 1
    a.renew()
    assert json.loads(path.read_text())["beat"] == first  # ttl/4 = 5 s not yet
    clock.now += 5
    a.renew()
    assert json.loads(path.read_text())["beat"] == first + 1


def test_garbage_in_the_lease_folder_is_no_lease(state):
    a = Lease(state, ttl=5, monotonic=Ticks(), host="hostA", pid=11)
    a.folder.mkdir(parents=True, mode=0o700)
    (a.folder / "7").write_text("not json")
    (a.folder / "notes.txt").write_text("hello")
    assert not a.hold()  # an unreadable top term counts as held until it stays unchanged for ttl
    a.monotonic.now += 5
    assert a.hold() and a.term == 8


def test_a_lease_folder_others_may_write_is_no_lease(state, caplog):
    """Another user able to write it could hold the lease forever and keep every watcher standing by."""
    folder = Path(f"{state}.lease")
    folder.mkdir(parents=True, mode=0o777)
    folder.chmod(0o777)
    (folder / "99").write_text(json.dumps({"holder": "mallory:1:x", "host": "elsewhere", "pid": 1}))
    a = Lease(state, ttl=5, host="hostA", pid=11)
    assert a.hold() and a.still_mine()  # acts alone
    assert a.hold()
    a.release()  # a clean stop writes nothing there
    assert json.loads((folder / "99").read_text())["holder"] == "mallory:1:x"
    assert sum("cannot be trusted" in r.getMessage() for r in caplog.records) == 1
