"""Whom root believes for a file, and how it reads one a user might have put in its way.

``writer_uids``: root, and the uids ``hooks install`` listed in the root-owned ``<state_dir>/writers``
(SlurmUser, for EpilogSlurmctld). ``read_small`` is the one way to read a small file of ours (a notice,
an event) from a place where a user could have left a link, a FIFO, a device or a huge file instead:
``O_NOFOLLOW`` (a link is not followed), ``O_NONBLOCK`` (a FIFO never blocks the open), then on the open
descriptor a regular file, at most ``cap`` bytes, owned by one of ``owners``. Standard library only.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

WRITERS = "writers"  # <state_dir>/writers: uids (one a line) besides root whose files are trusted


class Refused(OSError):
    """A file that is not one of ours (a link, a FIFO, too big, another user's): never read."""


def writer_uids(state_dir: Path | str) -> frozenset[int]:
    """Root, and the uids ``hooks install`` named (SlurmUser), if that file is root's and closed."""
    uids = {0}
    try:
        text = read_small(Path(state_dir) / WRITERS, 4096, {0}, closed=True)
    except OSError:
        return frozenset(uids)
    uids |= {int(word) for word in text.split() if re.fullmatch(rb"[0-9]{1,10}", word)}
    return frozenset(uids)


def read_small(
    path: Path | str,
    cap: int,
    owners: Collection[int] | None = None,
    closed: bool = False,
    dir_fd: int | None = None,
) -> bytes:
    """The bytes of the regular file ``path`` (at most ``cap`` of them), owned by one of ``owners``
    (None: anyone), and with ``closed`` writable by its owner only. Raises OSError (``Refused``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{path}: not a regular file")
        if info.st_size > cap:
            raise Refused(f"{path}: {info.st_size} bytes, more than {cap}")
        if owners is not None and info.st_uid not in owners:
            raise Refused(f"{path}: belongs to uid {info.st_uid}, not one of {sorted(owners)}")
        if closed and info.st_mode & 0o022:
            raise Refused(f"{path}: others may write it (mode {stat.S_IMODE(info.st_mode):o})")
        data = handle.read(cap + 1)
    if len(data) > cap:  # grew since the fstat
        raise Refused(f"{path}: more than {cap} bytes")
    return data
