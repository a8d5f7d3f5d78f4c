"""PyTorch state dicts in the checkpoint store (optional: imported only by ``TorchFormat``, and to load).

A synchronous save streams ``torch.save`` of the live state straight into the durable writer: torch
hands each tensor's bytes to ``write`` as a view (a GPU tensor is copied to the host one storage at a
time by torch itself), so nothing is cloned or serialised into memory first.

A background save copies every tensor into host memory kept from the previous background save
(``TorchStaging``; pinned when the tensor lives on a GPU), the only stall; ``torch.save`` of that copy
then streams to disk in the writer thread. Other mutable leaves (NumPy arrays, lists of numbers...)
are deep-copied, so the caller may change anything once the call returns.

Loading maps the verified file (``torch.load(mmap=True)``): the checksum pass already brought its pages
into the page cache, so the tensors are backed by them and nothing is read or copied a second time.
The file is leased first (``mapguard``), so no other process can change or truncate it between the
check and the map, nor SIGBUS the tensors later.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from slurm_preempt.errors import MissingDependencyError
from slurm_preempt.job.snapshot import Snapshot

FILE = "state.pt"
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None))


def _torch():
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            "PyTorch is not installed: pip install 'slurm-preempt[torch]' to save state dicts"
        ) from None
    return torch


class TorchStaging:
    """Host tensors a background save copies into, reused by the next background save when the same
    place in the state holds a tensor of the same shape, dtype and device kind."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, Any] = {}

    def copy(self, state: Any) -> Any:
        torch = _torch()
        old, self._buffers = self._buffers, {}
        seen: dict[int, Any] = {}
        on_gpu: list[Any] = []

        def walk(value: Any, where: tuple) -> Any:
            if isinstance(value, torch.Tensor):
                if id(value) not in seen:  # the same tensor twice (tied weights): one copy, shared
                    seen[id(value)] = self._stage(torch, value.detach(), where, old, on_gpu)
                return seen[id(value)]
            if isinstance(value, dict):
                rebuilt = type(value)((k, walk(v, (*where, k))) for k, v in value.items())
                if hasattr(value, "_metadata"):  # module versions from state_dict(), for load_state_dict
                    rebuilt._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
                return rebuilt
            if type(value) in (list, tuple):
                return type(value)(walk(v, (*where, i)) for i, v in enumerate(value))
            if isinstance(value, (*_IMMUTABLE, torch.dtype, torch.device)):
                return value
            return copy.deepcopy(value)

        staged = walk(state, ())
        if on_gpu:
            torch.cuda.synchronize()  # the non-blocking device-to-host copies must land before we return
        return staged

    def _stage(self, torch, source: Any, where: tuple, old: dict, on_gpu: list) -> Any:
        if source.layout != torch.strided or source.is_quantized:
            return source.to("cpu", copy=True)  # no reusable buffer for sparse or quantized tensors
        key = (where, tuple(source.shape), source.dtype, source.device.type)
        buffer = old.get(key)
        if buffer is None:
            pinned = source.is_cuda and torch.cuda.is_available()
            buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=pinned)
        buffer.copy_(source, non_blocking=source.is_cuda)
        if source.is_cuda:
            on_gpu.append(source)
        self._buffers[key] = buffer
        return buffer


def snapshot(state: Any, staging: TorchStaging | None = None) -> Snapshot:
    """What to write for ``state``: the live tensors (``staging`` None, a synchronous save), else copies
    in ``staging`` (a background save)."""
    torch = _torch()
    target = state if staging is None else staging.copy(state)
    return Snapshot(kind="torch", streams={FILE: lambda writer: torch.save(target, writer)})


def load(path: Path, want: dict | None = None, map_location: str = "cpu") -> Any:
    """The state in ``path``, its tensors over a mapping of the file (no copy), checked against its
    manifest entry ``want`` first (None: not checked). The file stays under a read lease while it is
    mapped (``mapguard``); where none can be had it is read into memory instead."""
    from slurm_preempt.job import mapguard
    from slurm_preempt.job.checkpoint_io import verify_file

    torch = _torch()
    lease = mapguard.lease_file(path)
    try:
        if want is not None:
            verify_file(path, want)
        if lease is None:
            return torch.load(path, map_location=map_location, weights_only=False)
        try:
            return torch.load(path, map_location=map_location, weights_only=False, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(path, map_location=map_location, weights_only=False)  # an old, non-zip file
    finally:
        if lease is not None:
            lease.settled = True  # from now on, let go once torch's mapping is gone
