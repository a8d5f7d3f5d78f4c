"""Processes the test cluster starts: found again by pid and start tick, whatever the wall clock does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from slurm_preempt import procinfo
from slurm_preempt.rehearsal import procs

# A child that renames itself (its comm, field 2 of /proc/PID/stat) to something a parser splitting on
# spaces or on the first ")" gets wrong, then waits to be stopped.
RENAME_AND_WAIT = (
    "import sys, time\n"
    "open('/proc/self/comm', 'w').write(') 1 2 (x) ')\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def child(tmp_path: Path):
    log = tmp_path / "child.out"
    started = procs.start("child", [sys.executable, "-c", RENAME_AND_WAIT], {}, log)
    assert procs.wait_until(lambda: "ready" in log.read_text(), 10)
    yield started
    procs.stop([p for p in [started.process()] if p is not None], grace=2)


def test_the_start_tick_is_recorded_at_start(child):
    assert psutil.Process(child.pid).name() == ") 1 2 (x) "  # procinfo reads past it (test_procinfo)
    assert child.start_ticks is not None and child.start_ticks == procinfo.start_ticks(child.pid)


def test_identity_is_the_start_tick_not_the_wall_clock(child):
    # A clock step (time sync, a VM resumed from a snapshot) moves psutil's wall-clock creation time by
    # whole seconds: the daemon is still ours.
    stepped = procs.Started(child.role, child.pid, child.create_time - 7.0, child.argv, child.start_ticks)
    assert stepped.process() is not None and stepped.alive
    stranger = procs.Started(child.role, child.pid, child.create_time, child.argv, child.start_ticks + 1)
    assert stranger.process() is None


def test_round_trip_and_a_file_written_before_start_ticks(child):
    assert procs.Started.from_json(child.to_json()) == child
    old = {k: v for k, v in child.to_json().items() if k != "start_ticks"}
    legacy = procs.Started.from_json(old)
    assert legacy.start_ticks is None and legacy.alive  # compared by wall clock, as it was recorded
    moved = procs.Started.from_json({**old, "create_time": child.create_time - 60})
    assert not moved.alive


def test_a_stopped_process_is_not_alive(tmp_path):
    started = procs.start("sleeper", ["sleep", "30"], {}, tmp_path / "sleep.out")
    proc = started.process()
    assert proc is not None
    procs.stop([proc], grace=5)
    assert not started.alive  # reaped, or a zombie where nobody reaps: stopped either way


def _open_names() -> list[str]:
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return names


def test_a_pinned_namespace_keeps_its_id_while_the_block_runs():
    """The namespace of a process in its own mount namespace is named (ours never) and held open: its
    last process may die inside the block without its id going to a namespace made meanwhile."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare (a failure under CI=true)")
    child = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sleep", "60"])
    try:
        proc = psutil.Process(child.pid)
        assert procs.wait_until(lambda: procs.mount_namespace(proc) != procs.mount_namespace(), 10)
        theirs = procs.mount_namespace(proc)
        with procs.pinned_mount_namespaces([proc, psutil.Process()]) as names:
            assert names == {theirs}
            child.kill()
            child.wait()
            assert theirs in _open_names()  # still held after its last process died
        assert theirs not in _open_names()
    finally:
        child.kill()
        child.wait()
