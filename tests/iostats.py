"""What a test can learn about the I/O of its own process (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def disk_bytes_read() -> int:
    """Bytes this process had fetched from storage (not from the page cache)."""
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("read_bytes")).split()[1])


def forget_cached(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
