"""How a checkpoint is written: one object per way, chosen once (``Run(format=...)``,
``CheckpointStore(format=...)``), so that no two ways can be asked for at once.

- ``PickleFormat()``, the default: bytes (one file, ``data.bin``), ``{name: bytes}`` (one file each) or
  any picklable object (pickle protocol 5: NumPy arrays and other buffers go out of band, written from
  where they are).
- ``TorchFormat()``: PyTorch state dicts (tensors anywhere in nested dicts and lists) with ``torch.save``
  streamed to disk (``job/torchstate.py``); needs the ``[torch]`` extra.
- ``ShardedFormat()``: every rank writes its part of each checkpoint with torch.distributed.checkpoint
  (DCP) and one commit makes the parts visible together (``job/sharded.py``); restored in place into
  a state dict laid out for this world size (DCP reshards).

``background=True`` exists only on the formats whose saves can run on a helper thread (pickle and
torch): a save then stalls only for a copy of the state into memory kept from the previous background
save (host tensors, pinned for GPU tensors), and the write runs behind the caller. Sharded saves are
collectives of every rank and stay synchronous: ``ShardedFormat(background=True)`` is a TypeError, as
is a torch-and-sharded checkpoint (one object, one format).

Reading needs no format: a whole checkpoint's manifest names its kind (``bytes``, ``files``,
``pickle``, ``torch``) and is read by it; a sharded one is read by every rank in step, through the
sharded format's loader. Import-light: torch loads only when a torch or sharded save or load runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from slurm_preempt.job.snapshot import Snapshot, Staging, snapshot_of

if TYPE_CHECKING:
    from slurm_preempt.job.checkpoint import Checkpoint
    from slurm_preempt.job.sharded import Writer
    from slurm_preempt.job.torchstate import TorchStaging


@dataclass(frozen=True, kw_only=True)
class PickleFormat:
    """bytes, ``{name: bytes}`` or any picklable object; ``background``: periodic saves on a thread."""

    background: bool = False
    sharded: ClassVar[bool] = False

    def staging(self) -> Staging:
        return Staging()

    def snapshot(self, payload: Any, staging: Staging | None = None) -> Snapshot:
        """What to write: the payload's own buffers (``staging`` None, a synchronous save), else copies
        in ``staging`` (a background save)."""
        return snapshot_of(payload, staging)


@dataclass(frozen=True, kw_only=True)
class TorchFormat:
    """PyTorch state dicts with ``torch.save``; ``background``: periodic saves stall only for a copy of
    the tensors to host memory."""

    background: bool = False
    sharded: ClassVar[bool] = False

    def staging(self) -> TorchStaging:
        from slurm_preempt.job import torchstate

        return torchstate.TorchStaging()

    def snapshot(self, payload: Any, staging: TorchStaging | None = None) -> Snapshot:
        """What to write: the live tensors (``staging`` None), else copies in ``staging``."""
        from slurm_preempt.job import torchstate

        return torchstate.snapshot(payload, staging)


@dataclass(frozen=True)
class ShardedFormat:
    """Every rank writes its part with DCP, one commit; synchronous (a collective of every rank)."""

    background: ClassVar[bool] = False
    sharded: ClassVar[bool] = True
    name: ClassVar[str] = "dcp"  # the manifest's "format": which writer wrote the parts

    def writer(self, state: Any) -> Writer:
        """Writes this rank's part of ``state`` (a state dict) into the checkpoint's folder."""
        from slurm_preempt.job import dcpstate

        return dcpstate.writer(state)

    def loader(self, into: Any) -> Callable[[Checkpoint], Any]:
        """Fills ``into`` (a state dict) in place from a checkpoint this format wrote (resharding)."""
        from slurm_preempt.job import dcpstate

        return dcpstate.loader(into)


WholeFormat = PickleFormat | TorchFormat  # one process writes the whole checkpoint
Format = PickleFormat | TorchFormat | ShardedFormat

__all__ = ["Format", "PickleFormat", "ShardedFormat", "TorchFormat", "WholeFormat"]
