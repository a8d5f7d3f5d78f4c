"""The few Slurm calls the drain watcher and its actions make, as a ``typing.Protocol``.

``slurm_preempt.slurm.commands.Slurm`` satisfies it by running the real commands; the unit tests plug
in an in-memory fake (tests/fakeslurm.py) to check the watcher's decisions without a cluster. Anything
that is not here is not used by the watcher: a new call must be added here, to ``Slurm`` and to the fake
(mypy checks the fake against this protocol: tests/fakeslurm.py is in its files).

Implementations may be called from several threads at once (the watcher signals jobs in chunks side by
side), so they keep no per-call state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.slurm.priority import Queued


class WatcherSlurm(Protocol):
    def nodes(
        self, *, names: Iterable[str] | None = None, states: str | None = None, partition: str | None = None
    ) -> list[Node]:
        """``sinfo -N``: the nodes named (all when None) in the states given (e.g. ``drain,down``), of
        one partition when given."""
        ...

    def jobs(
        self,
        *,
        job_ids: Iterable[str] | None = None,
        nodes: Iterable[str] | None = None,
        states: str | None = None,
        user: str | None = None,
    ) -> list[Job]:
        """``squeue``: jobs with these ids, on these nodes, in these states (e.g. ``running,configuring``),
        of this user (a user's own watcher)."""
        ...

    def queue(self, partition: str) -> list[Queued]:
        """``squeue -t pending,running -p P``: each job's id, priority, state and reason (grow-back)."""
        ...

    def signal_many(self, job_ids: Sequence[str], signal: str, *, batch_only: bool = False) -> str:
        """One ``scancel --signal`` for many jobs; returns the stderr naming those it could not signal
        (``""`` when all were). Raises SlurmError only when nothing is known to be sent (timeout)."""
        ...

    def requeue(self, job_id: str) -> None:
        """``scontrol requeue``; JobGoneError when the job has ended."""
        ...

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update jobid=J key=value ...`` (``starttime=now``, ``features=standard``)."""
        ...

    def release(self, job_id: str) -> None:
        """``scontrol release``: lift the hold Slurm puts on a job whose launch failed."""
        ...
