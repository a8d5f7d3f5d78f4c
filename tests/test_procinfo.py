"""procinfo: /proc/PID/stat read right whatever a process calls itself; None for anything unknown."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from slurm_preempt import procinfo

# A child that renames itself (its comm, field 2 of /proc/PID/stat) to something a parser splitting on
# spaces or on the first ")" gets wrong, then waits for its stdin to close.
ODD_NAME = ") (x) 1 2 ("
RENAME_AND_WAIT = f"open('/proc/self/comm', 'w').write({ODD_NAME!r})\nprint('ready', flush=True)\ninput()\n"
NO_SUCH_PID = 2**22 + 1  # above the kernel's largest pid_max: never a process


@pytest.fixture
def odd_child():
    child = subprocess.Popen(
        [sys.executable, "-c", RENAME_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    yield child
    child.communicate("\n", timeout=30)


def test_a_name_with_parentheses_and_spaces_is_read_past(odd_child):
    found = procinfo.read(odd_child.pid)
    assert found is not None
    real = psutil.Process(odd_child.pid)
    assert found.comm == real.name() == ODD_NAME
    assert found.ppid == os.getpid() == real.ppid()
    assert found.state in ("S", "R")  # waiting on its stdin, or just woken
    mine = procinfo.read(os.getpid())
    assert mine is not None and found.start_ticks >= mine.start_ticks  # started after this test process
    assert procinfo.start_ticks(odd_child.pid) == found.start_ticks


def test_a_vanished_process_is_unknown_not_an_error():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc entry is gone
    assert procinfo.read(child.pid) is None
    assert procinfo.start_ticks(child.pid) is None
    assert procinfo.read(NO_SUCH_PID) is None and procinfo.start_ticks(NO_SUCH_PID) is None
    assert procinfo.read(-1) is None


def test_a_zombie_is_still_there_and_says_so():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, left unreaped
    found = procinfo.read(child.pid)
    assert found is not None and found.state == "Z"
    child.wait()


@pytest.mark.parametrize(
    ("raw", "comm"),
    [
        (b"42 (a) (b)) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9001 1 2 3\n", "a) (b)"),
        (b"42 () R 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9001 1 2\n", ""),
        (b"42 (x\ny z) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9001\n", "x\ny z"),
        (b"42 (\xff\xfe) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9001\n", "\ufffd\ufffd"),
    ],
)
def test_fields_are_counted_from_the_last_parenthesis(raw, comm):
    assert procinfo.parse(42, raw) == procinfo.Stat(
        42, comm, raw.rsplit(b")", 1)[1].split()[0].decode(), 7, 9001
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"42 (no closing S 7 42 42 0",
        b"42 x) S 7 42",  # a ")" with no "(" before it
        b"42 (a) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0",  # cut before field 22
        b"42 (a) S seven 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 9001",
    ],
)
def test_a_line_that_does_not_parse_is_unknown(raw):
    assert procinfo.parse(42, raw) is None


def test_this_system_has_proc():
    assert procinfo.available()
