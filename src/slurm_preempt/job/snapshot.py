"""Snapshots: what a checkpoint save writes.

A synchronous save writes the caller's buffers where they are (the caller waits, so nothing changes
under the writer): no copy. A background save must copy, since the caller goes on changing its state;
it copies into a ``Staging`` area kept from the previous background save, so a steady run of saves maps
its memory once (a copy into fresh memory also pays a page fault per 4 KiB page).
Standard library only.
"""

from __future__ import annotations

import mmap
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError

MANIFEST = "MANIFEST.json"
OWNER_FILE = ".owner"  # in a folder being written: who writes it (see commit.py)
BYTES_FILE = "data.bin"
PICKLE_FILE = "state.pkl"
BUFFERS_FILE = "state.buffers"
BYTES_LIKE = (bytes, bytearray, memoryview, mmap.mmap)


@dataclass
class Snapshot:
    """What a save writes: file name -> pieces (bytes-like, written from where they are), file name ->
    producer streaming into the file (``torch.save``), files to copy, and extra manifest fields."""

    files: dict[str, list[Any]] = field(default_factory=dict)
    kind: str = "bytes"
    extra: dict[str, Any] = field(default_factory=dict)
    copies: dict[str, Path] = field(default_factory=dict)  # name in checkpoint -> file to copy
    streams: dict[str, Callable[[Any], None]] = field(default_factory=dict)


class Staging:
    """Memory a background save copies into, kept for the next one. Buffers are matched by size in
    the order they are asked for; ones not asked for again are released."""

    def __init__(self) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._used: dict[int, list[mmap.mmap]] = {}

    def copy(self, data: Any) -> memoryview:
        source = memoryview(data).cast("B")
        size = len(source)
        if size == 0:
            return memoryview(b"")
        pool = self._free.get(size)
        buffer = pool.pop(0) if pool else mmap.mmap(-1, size)  # anonymous: no zero-filling pass
        self._used.setdefault(size, []).append(buffer)
        target = memoryview(buffer)
        target[:] = source
        return target

    def begin(self) -> None:
        """Start a new snapshot: the previous save is done with every buffer."""
        self._free = {size: pool for size, pool in self._used.items()}
        self._used = {}

    def end(self) -> None:
        self._free = {}  # not asked for again: released


def snapshot_of(payload: Any, staging: Staging | None = None) -> Snapshot:
    """What to write for ``payload``: its own buffers (``staging`` None, a synchronous save), else copies
    in ``staging`` (a background save).

    bytes -> ``data.bin``; a mapping of names to bytes -> one file each; anything else -> pickle
    (protocol 5: NumPy arrays and other PickleBuffer exporters go out of band, written from where
    they are; bytes and bytearrays inside an object are copied into the pickle, as pickle does).
    """
    keep = (lambda data: data) if staging is None else staging.copy
    if staging is not None:
        staging.begin()
    try:
        return _snapshot(payload, keep)
    finally:
        if staging is not None:
            staging.end()


def _snapshot(payload: Any, keep: Callable[[Any], Any]) -> Snapshot:
    if isinstance(payload, BYTES_LIKE):
        return Snapshot({BYTES_FILE: [keep(payload)]}, "bytes")
    if (
        isinstance(payload, Mapping)
        and payload
        and all(isinstance(k, str) and isinstance(v, BYTES_LIKE) for k, v in payload.items())
    ):
        for name in payload:
            _check_name(name)
        return Snapshot({k: [keep(v)] for k, v in payload.items()}, "files")
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    pieces = [keep(buf.raw()) for buf in buffers]
    return Snapshot(
        {PICKLE_FILE: [head], BUFFERS_FILE: pieces},
        "pickle",
        {"buffers": [memoryview(p).nbytes for p in pieces]},
    )


def snapshot_of_paths(paths: Iterable[Path | str]) -> Snapshot:
    """Files and folders to copy into a checkpoint under their base names (for shell jobs)."""
    snap = Snapshot(kind="paths")
    for item in map(Path, paths):
        if item.is_dir():
            for sub in sorted(p for p in item.rglob("*") if p.is_file()):
                snap.copies[str(Path(item.name) / sub.relative_to(item))] = sub
        elif item.is_file():
            snap.copies[item.name] = item
        else:
            raise CheckpointError(f"cannot checkpoint {item}: no such file or folder")
    if not snap.copies:
        raise CheckpointError("nothing to checkpoint: the paths given hold no files")
    for name in snap.copies:
        _check_name(name)
    return snap


def _check_name(name: str) -> None:
    parts = Path(name).parts
    if not name or name in (MANIFEST, OWNER_FILE) or Path(name).is_absolute() or ".." in parts:
        raise CheckpointError(f"bad file name in checkpoint: {name!r}")
