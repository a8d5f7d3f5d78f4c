"""Views of checkpoint files over the page cache that another process cannot turn into a SIGBUS.

A mapped file whose length another process cuts (``truncate``, ``open(..., "w")``) kills the reader
with SIGBUS the next time it touches a page past the new end; private copy-on-write pages are dropped
too (Linux unmaps them on truncation, as POSIX wants), and Python cannot catch SIGBUS. So a file is
mapped only while this process holds a read lease on it (``fcntl(F_SETLEASE, F_RDLCK)``): the kernel
then holds any process that opens the file for writing or truncates it (for up to
``/proc/sys/fs/lease-break-time``, 45 s by default) until the lease is let go. A watch thread sees the
break pending (``F_GETLEASE``, polled every ``POLL`` seconds while leases are held), moves every mapping
of that file in this process (ours, and ``torch.load(mmap=True)``'s, found in ``/proc/self/maps``) onto
anonymous memory holding the same bytes, at the same addresses (``mremap``: views and tensors stay
valid), and only then lets go; the writer proceeds and this process never sees its change. A lease
whose file is mapped nowhere any more is let go too. The break signal (SIGIO, whose default action
would end the process) is turned off on the leased descriptor.

Where no lease can be had (not Linux; NFS, Lustre and other file systems without leases; a file that
someone has open for writing; another user's file), the file is read into anonymous memory instead:
a copy, never a crash. Standard library only (ctypes for mmap/mremap).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import sys
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

POLL = 0.05  # seconds between looks at the leases: a truncating process waits at most about this
_F_SETLEASE = 1024  # F_LINUX_SPECIFIC_BASE + 0
_F_GETLEASE = 1025
_F_SETSIG = 10
_F_SETOWN = 8
_SIGURG = 23  # ignored unless handled: where the break signal goes until the owner is cleared
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MAP_FAILED = ctypes.c_void_p(-1).value


class _Lease:
    def __init__(self, fd: int, stat: os.stat_result, size: int) -> None:
        self.fd = fd
        self.inode = stat.st_ino
        self.device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}"
        self.size = size
        self.settled = False  # mapped by now: a lease whose file is mapped nowhere may be let go


_leases: dict[int, _Lease] = {}  # fd -> lease
_lock = threading.Lock()
_watcher: threading.Thread | None = None
_libc: Any = None


def view(path: Path, writable: bool = False) -> Any:
    """The file's bytes: a read-only memoryview over its cached pages, lease-guarded; or, when
    ``writable`` or when no lease can be had, a copy in anonymous memory (writable if asked). b"" when
    the file is empty."""
    if not writable:
        lease = lease_file(path)
        if lease is not None:
            if lease.size == 0:
                release(lease)
                return b""
            mapping = mmap.mmap(lease.fd, lease.size, access=mmap.ACCESS_READ)
            lease.settled = True
            _advise(mapping)
            return memoryview(mapping)
    return read_copy(path, writable)


def read_copy(path: Path, writable: bool = False) -> Any:
    """The file read into anonymous memory (no zero-filling pass): never backed by the file."""
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return bytearray() if writable else b""
        buffer = mmap.mmap(-1, size)
        target, done = memoryview(buffer), 0
        while done < size:
            count = handle.readinto(target[done:])
            if not count:
                raise OSError(errno.EIO, f"{path.name} shrank while being read")
            done += count
        return target if writable else target.toreadonly()


def lease_file(path: Path) -> _Lease | None:
    """A read lease on ``path`` for as long as this process maps it, or None where none can be had."""
    if not sys.platform.startswith("linux"):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.fcntl(fd, _F_SETSIG, _SIGURG)
        fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, _F_SETOWN, 0)  # the lease made us the owner: no break signal at all
        lease = _Lease(fd, os.fstat(fd), os.fstat(fd).st_size)
    except OSError as exc:
        log.debug("no read lease on %s (%s): reading a copy", path, exc)
        os.close(fd)
        return None
    with _lock:
        _leases[fd] = lease
        _start_watcher()
    return lease


def release(lease: _Lease) -> None:
    with _lock:
        if _leases.pop(lease.fd, None) is not None:
            _let_go(lease.fd)


def _let_go(fd: int) -> None:
    # Explicitly: the lease belongs to the open file, which a mapping's duplicate descriptor
    # (Python's mmap keeps one) would keep open, and the lease with it, past our close.
    try:
        fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)
    finally:
        os.close(fd)


def held() -> int:
    """How many files are leased now (for tests)."""
    with _lock:
        return len(_leases)


def _start_watcher() -> None:
    global _watcher
    if _watcher is None or not _watcher.is_alive():
        _watcher = threading.Thread(target=_watch, name="slurm-preempt-mapguard", daemon=True)
        _watcher.start()


def _watch() -> None:
    wake = threading.Event()
    turn = 0
    while True:
        wake.wait(POLL)
        turn += 1
        with _lock:
            if not _leases:
                return
            for lease in list(_leases.values()):
                try:
                    _check(lease, look_for_maps=turn % 20 == 0)
                except OSError as exc:  # one bad lease never stops the guard of the others
                    log.warning("checkpoint map guard: %s", exc)


def _check(lease: _Lease, look_for_maps: bool) -> None:
    breaking = fcntl.fcntl(lease.fd, _F_GETLEASE) != fcntl.F_RDLCK
    if breaking:
        moved = _detach(lease)
        log.info("a checkpoint file mapped here is being changed: %d mapping(s) moved to memory", moved)
    elif not look_for_maps or not lease.settled or _mappings(lease):
        return
    del _leases[lease.fd]
    _let_go(lease.fd)


def _mappings(lease: _Lease) -> list[tuple[int, int, str, int]]:
    """(start, end, permissions, file offset) of every mapping of the leased file in this process."""
    found = []
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) >= 5 and fields[4] == str(lease.inode) and fields[3] == lease.device:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found.append((start, end, fields[1], int(fields[2], 16)))
    return found


def _detach(lease: _Lease) -> int:
    """Move every mapping of the file onto anonymous memory with the same bytes, same addresses."""
    libc = _c()
    regions = _mappings(lease)
    for start, end, perms, offset in regions:
        length = end - start
        anon = libc.mmap(
            None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0
        )
        if anon == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), "mmap of a copy failed")
        inside = max(0, min(length, lease.size - offset))  # pages past the end were never readable
        ctypes.memmove(anon, start, inside)
        protection = (mmap.PROT_READ if "r" in perms else 0) | (mmap.PROT_WRITE if "w" in perms else 0)
        libc.mprotect(ctypes.c_void_p(anon), length, protection | (mmap.PROT_EXEC if "x" in perms else 0))
        moved = libc.mremap(
            ctypes.c_void_p(anon), length, length, _MREMAP_MAYMOVE | _MREMAP_FIXED, ctypes.c_void_p(start)
        )
        if moved == _MAP_FAILED:
            raise OSError(ctypes.get_errno(), "mremap over a file mapping failed")
    return len(regions)


def _c() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.mremap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = libc
    return _libc


def _advise(mapping: mmap.mmap) -> None:
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_WILLNEED"):
        mapping.madvise(mmap.MADV_WILLNEED)
