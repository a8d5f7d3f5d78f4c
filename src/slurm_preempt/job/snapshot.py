"""Snapshots: what a checkpoint save writes, taken in memory at call time.

A background save may only run while the caller goes on changing its state because the snapshot is a
copy. Standard library only.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError

MANIFEST = "MANIFEST.json"
BYTES_FILE = "data.bin"
PICKLE_FILE = "state.pkl"
BUFFERS_FILE = "state.buffers"


@dataclass
class Snapshot:
    """What a save writes: file name -> bytes-like, plus manifest fields. Built in memory, written later."""

    files: dict[str, Any] = field(default_factory=dict)
    kind: str = "bytes"
    extra: dict[str, Any] = field(default_factory=dict)
    copies: dict[str, Path] = field(default_factory=dict)  # name in checkpoint -> file to copy
    lazy: Any = None  # callable run by the writer (maybe in the background) -> more name: bytes files


def snapshot_of(payload: Any) -> Snapshot:
    """Copy ``payload`` into memory now so the caller may change it while a background save writes.

    bytes -> ``data.bin``; a mapping of names to bytes -> one file each; anything else -> pickle
    (protocol 5, large buffers out of band so each is copied exactly once).
    """
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return Snapshot({BYTES_FILE: bytes(payload)}, "bytes")
    if (
        isinstance(payload, Mapping)
        and payload
        and all(
            isinstance(k, str) and isinstance(v, (bytes, bytearray, memoryview)) for k, v in payload.items()
        )
    ):
        for name in payload:
            _check_name(name)
        return Snapshot({k: bytes(v) for k, v in payload.items()}, "files")
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    copies = [buf.raw().tobytes() for buf in buffers]
    return Snapshot(
        {PICKLE_FILE: head, BUFFERS_FILE: copies},
        "pickle",
        {"buffers": [len(c) for c in copies]},
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
    return snap


def _check_name(name: str) -> None:
    parts = Path(name).parts
    if not name or name == MANIFEST or Path(name).is_absolute() or ".." in parts:
        raise CheckpointError(f"bad file name in checkpoint: {name!r}")
