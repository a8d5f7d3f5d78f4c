"""Multi-rank agreement: every rank learns, at the same step boundary, what any rank saw.

A notice (file or signal) reaches ranks at different moments, and a checkpoint that some ranks take at
step 100 and others at step 101 is worthless. So ``Run`` never acts on its local flags: at each step
boundary all ranks exchange them and act on the element-wise maximum. Implementations:

- ``SingleProcess``: one rank, nothing to exchange.
- ``TorchAgreement``: ``torch.distributed.all_reduce(MAX)`` of a small int tensor on the CPU (over a
  gloo group beside NCCL); the collective is itself the step-boundary barrier.
- ``FileAgreement``: ranks meet through files in a shared folder (no torch, no sockets); for tests and
  for multi-process jobs without a communication library.

Import-light: torch is imported only when a TorchAgreement is built.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from slurm_preempt.durable import write_atomic
from slurm_preempt.errors import SlurmPreemptError

log = logging.getLogger(__name__)


class Agreement(Protocol):
    rank: int
    world: int

    def agree(self, flags: Sequence[int]) -> list[int]:
        """Element-wise maximum of ``flags`` over all ranks. Every rank must call it, in step."""


class SingleProcess:
    rank = 0
    world = 1

    def agree(self, flags: Sequence[int]) -> list[int]:
        return [int(f) for f in flags]


class TorchAgreement:
    """All-reduce MAX of a few int64 on the CPU, over torch.distributed (which must be initialised).

    The flags never touch the GPU: reading a CUDA result back would wait for every kernel queued so far
    at each step boundary. When the default group is not gloo (NCCL), one gloo group over the same ranks
    is made here (a collective: every rank builds its Run at the same point) and carries the flags.
    """

    def __init__(self, group=None):
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise SlurmPreemptError("torch.distributed is not initialised: call init_process_group first")
        self._torch, self._dist = torch, dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._own_group = group is None and dist.get_backend() != "gloo"
        if self._own_group:
            group = dist.new_group(backend="gloo")
        self.group = group

    def close(self) -> None:
        """Destroy the gloo group made here (never the caller's): a group left to the interpreter's
        exit may abort the process ("terminate called without an active exception")."""
        if self._own_group and self._dist.is_initialized():
            self._dist.destroy_process_group(self.group)
            self._own_group = False

    def agree(self, flags: Sequence[int]) -> list[int]:
        tensor = self._torch.tensor([int(f) for f in flags], dtype=self._torch.int64)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MAX, group=self.group)
        return [int(v) for v in tensor.tolist()]


class FileAgreement:
    """Ranks meet in ``folder``: round N, each rank writes ``N/<rank>.json`` and waits for all ``world``.

    Every rank must call ``agree`` the same number of times. Rank 0 removes round N-2 (all ranks have
    finished reading it once they have written round N-1).
    """

    def __init__(
        self, folder: Path | str, rank: int, world: int, timeout: float = 300.0, poll: float = 0.002
    ):
        self.folder, self.rank, self.world = Path(folder), rank, world
        self.timeout, self.poll = timeout, poll
        self.round = 0
        self.folder.mkdir(parents=True, exist_ok=True)

    def agree(self, flags: Sequence[int]) -> list[int]:
        here = self.folder / f"{self.round:09d}"
        here.mkdir(exist_ok=True)
        # Not synced: a round matters only while its ranks live.
        write_atomic(here / f"{self.rank}.json", json.dumps([int(f) for f in flags]), sync=False)
        values = self._gather(here)
        if self.rank == 0 and self.round >= 2:
            shutil.rmtree(self.folder / f"{self.round - 2:09d}", ignore_errors=True)
        self.round += 1
        return [max(column) for column in zip(*values, strict=True)]

    def _gather(self, here: Path) -> list[list[int]]:
        deadline = time.monotonic() + self.timeout
        while True:
            names = [n for n in os.listdir(here) if n.endswith(".json")]
            if len(names) >= self.world:
                return [json.loads((here / n).read_text()) for n in names]
            if time.monotonic() > deadline:
                raise SlurmPreemptError(
                    f"rank {self.rank}: only {len(names)} of {self.world} ranks reached round {self.round} "
                    f"in {self.folder} within {self.timeout:g} s"
                )
            time.sleep(self.poll)


def default(world: int) -> Agreement:
    """TorchAgreement when torch.distributed is already initialised (never imports torch), else one rank.

    More than one rank with no agreement: each rank decides alone; say so once.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return TorchAgreement()
    if world > 1:
        log.warning(
            "%d ranks but no agreement (torch.distributed not initialised): initialise it before "
            "building Run, so that all ranks checkpoint at the same step",
            world,
        )
    return SingleProcess()
