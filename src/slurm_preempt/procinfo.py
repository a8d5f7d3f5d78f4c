"""What ``/proc/PID/stat`` says about a process: its name, state, parent and start tick.

One reader for the watcher's lease, the job's scratch-folder owner, the job's start time and the test
cluster's daemons. "Unknown" is ``None`` everywhere: a process that is gone (or never was), a system
without ``/proc``, a file that does not parse. Nothing here raises.

Field 2 (``comm``, the command name in parentheses) is whatever the process called itself, up to 15
bytes, spaces and parentheses included (``prctl(PR_SET_NAME)``, a write to ``/proc/self/comm``): the
fields after it are counted from the *last* ``)`` of the line, which no later field can hold.
Start times are clock ticks since boot (field 22): unlike a wall-clock creation time (psutil's
``create_time()`` adds ``btime``, which the kernel derives from the wall clock at every read), they do
not move when the clock is stepped, so (pid, start tick) names one process for the life of the boot.
Import-light: standard library only (the job side imports it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Stat", "available", "read", "start_ticks"]


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/PID/stat`` its users need (man 5 proc numbers them from 1)."""

    pid: int
    comm: str  # 2: the command name, without its parentheses (undecodable bytes replaced)
    state: str  # 3: R, S, D, Z, T, ...
    ppid: int  # 4
    start_ticks: int  # 22: clock ticks since boot (os.sysconf("SC_CLK_TCK") per second)


def parse(pid: int, raw: bytes) -> Stat | None:
    """The fields of one ``/proc/PID/stat`` line; None when it does not parse."""
    opening, closing = raw.find(b"("), raw.rfind(b")")
    if opening < 0 or closing < opening:
        return None
    fields = raw[closing + 1 :].split()  # fields 3, 4, ... : field N is fields[N - 3]
    try:
        return Stat(
            pid=pid,
            comm=raw[opening + 1 : closing].decode("utf-8", "replace"),
            state=fields[0].decode("ascii", "replace"),
            ppid=int(fields[1]),
            start_ticks=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def read(pid: int) -> Stat | None:
    """Process ``pid`` as ``/proc`` sees it now; None when it is gone or cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as handle:
            raw = handle.read()
    except (OSError, ValueError):  # gone, never was, no /proc, a pid that is no number
        return None
    return parse(int(pid), raw)


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None when unknown."""
    found = read(pid)
    return None if found is None else found.start_ticks


def available() -> bool:
    """True when this system has a ``/proc`` that shows this process (Linux)."""
    return read(os.getpid()) is not None
