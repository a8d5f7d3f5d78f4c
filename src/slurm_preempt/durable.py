"""Durable file writes for the checkpoint store: write in chunks, CRC-32 as we go, fsync.

Standard library only.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

CHUNK = 8 << 20  # write and checksum in 8 MiB pieces: large enough for full disk speed


def checksum_file(path: Path) -> tuple[int, str]:
    """(size, crc32 hex) of a file, read in chunks."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, f"{crc:08x}"


def write_durably(path: Path, pieces: list) -> dict:
    """Write ``pieces`` to a new file, checksumming as it goes; fsync; return {bytes, crc32}."""
    crc, size = 0, 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for piece in pieces:
            view = memoryview(piece).cast("B")
            for start in range(0, len(view), CHUNK):
                part = view[start : start + CHUNK]
                crc = zlib.crc32(part, crc)
                while part:
                    written = os.write(fd, part)
                    part = part[written:]
                size += len(view[start : start + CHUNK])
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def copy_durably(source: Path, target: Path) -> dict:
    crc, size = 0, 0
    with open(source, "rb", buffering=0) as src:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            while chunk := src.read(CHUNK):
                crc = zlib.crc32(chunk, crc)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                size += len(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
