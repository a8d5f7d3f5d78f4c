"""PyTorch state dicts in the checkpoint store (optional: imported only by ``save_torch``/loading).

The snapshot clones every tensor to CPU memory (the only part a background save makes the caller wait
for); ``torch.save`` then serialises the copy in the writer thread.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from slurm_preempt.errors import MissingDependencyError
from slurm_preempt.job.snapshot import Snapshot

FILE = "state.pt"


def _torch():
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            "PyTorch is not installed: pip install 'slurm-preempt[torch]' to save state dicts"
        ) from None
    return torch


def cpu_copy(value: Any) -> Any:
    """``value`` with every tensor replaced by a detached CPU clone (dicts, lists, tuples walked)."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((k, cpu_copy(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(cpu_copy(v) for v in value)
    return value


def snapshot(state: Any) -> Snapshot:
    copy = cpu_copy(state)
    return Snapshot(kind="torch", lazy=lambda: {FILE: to_bytes(copy)})


def to_bytes(state: Any) -> bytes:
    buffer = io.BytesIO()
    _torch().save(state, buffer)
    return buffer.getvalue()


def load(path: Path, map_location: str = "cpu") -> Any:
    return _torch().load(path, map_location=map_location, weights_only=False)
