"""The job side's ledger writer: the events a job records about itself (``checkpoint_saved``,
``resumed_from``, ``requeued``) and the notice events an earlier attempt already acted on.

A job must run on without its ledger: a missing or unwritable state folder warns once and never
raises. The ledger's format and its other writers (the watcher, the hooks): ``slurm_preempt.ledger``.
Import-light: standard library only.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_preempt import ledger
from slurm_preempt.job.environment import JobEnv

if TYPE_CHECKING:
    from slurm_preempt.job.checkpoint import Checkpoint

log = logging.getLogger(__name__)


class LedgerWriter:
    """Ledger events of this job; a missing or unwritable state folder warns once and never raises."""

    def __init__(self, state_dir: Path | None, job_id: str):
        self.state_dir, self.job_id = state_dir, job_id
        self._warned = False

    @classmethod
    def for_job(cls, env: JobEnv) -> LedgerWriter:
        return cls(env.state_dir, env.job_id)

    def record(self, kind: str, **fields) -> Path | None:
        if self.state_dir is None or not self.job_id:
            return None
        try:
            return ledger.record(self.state_dir, self.job_id, kind, source="job", **fields)
        except (OSError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot write the ledger in %s (%s); carrying on without it", self.state_dir, exc)
            return None

    def checkpoint_saved(self, found: Checkpoint, final: bool, total_steps: int | None = None) -> Path | None:
        """``checkpoint_saved``: ``final`` when it is the checkpoint taken for a notice; ``total_steps``
        (when the job gave it) lets the watcher judge its progress against a fallback deadline."""
        extra = {} if total_steps is None else {"total_steps": total_steps}
        return self.record(
            "checkpoint_saved",
            step=found.step,
            path=str(found.path),
            bytes=found.nbytes,
            seconds=found.manifest.get("seconds"),
            final=final,
            **extra,
        )

    def handled_events(self) -> set[str]:
        """Notice event ids already acted on: an earlier attempt requeued for them, or this attempt
        shrank for them and runs its command again."""
        if self.state_dir is None or not self.job_id:
            return set()
        try:
            events = ledger.events(self.state_dir, self.job_id)
        except (OSError, ValueError):
            return set()
        return {
            e["event_id"] for e in events if e.get("kind") in ("requeued", "shrunk") and e.get("event_id")
        }
