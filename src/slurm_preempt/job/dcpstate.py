"""torch.distributed.checkpoint (DCP) as the writer and reader inside sharded checkpoints.

DCP plans the save across ranks, each rank writes its own shards to ``__<rank>_<n>.distcp`` (fsynced:
``sync_files=True``) and rank 0 writes the global ``.metadata``; ``job.sharded`` then checksums each
rank's files and commits them together. Loading fills the given state dict in place, and reshards: a
state laid out for another world size (DTensor, FSDP2 or other sharded tensors) takes its pieces from
whichever saved shards hold them, so a ``--nodes=2-4`` job may come back on any node count.
Imports torch only when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError, MissingDependencyError
from slurm_preempt.job.checkpoint import Checkpoint
from slurm_preempt.job.formats import ShardedFormat

FORMAT = ShardedFormat.name


def _dcp():
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        raise MissingDependencyError(
            "PyTorch is not installed: pip install 'slurm-preempt[torch]' for sharded checkpoints"
        ) from None
    return dcp


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def writer(state: dict[str, Any]):
    """A sharded-store writer that saves ``state`` (a state dict) with DCP on every rank."""
    dcp = _dcp()

    def write(folder: Path) -> None:
        # No list of names: files are claimed by name, __<rank>_* by each rank, .metadata by rank 0.
        writer = dcp.FileSystemWriter(str(folder), sync_files=True)
        dcp.save(state, storage_writer=writer, no_dist=not _distributed())

    return write


def loader(state: dict[str, Any]):
    """A sharded-store loader that fills ``state`` in place from a DCP checkpoint (resharding)."""
    dcp = _dcp()

    def load(found: Checkpoint) -> dict[str, Any]:
        if found.manifest.get("format") != FORMAT:
            raise CheckpointError(f"{found.path} was not written with DCP ({found.manifest.get('format')})")
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(found.path)), no_dist=not _distributed())
        return state

    return load
