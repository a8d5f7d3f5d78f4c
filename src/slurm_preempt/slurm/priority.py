"""The queue's order in one partition: each job's id, scheduling priority, state and reason.

``squeue -h -t pending,running --partition=P -o "%A %Q %T %r"``: ``%A`` is the job's own id (unique
per array task), ``%Q`` its priority (an integer on 22.05 through 26.05, whatever the priority plugin;
0 for a held job), ``%T`` its state, ``%r`` Slurm's reason (Slurm's words, never a user's text; last,
as it may hold spaces). Grow-back (``watch/growback.py``) reads it: a job told to grow back is
requeued and competes again for the nodes it frees, so it is told only when no pending job of its
partition outranks it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from slurm_preempt.slurm.parse import to_int

log = logging.getLogger(__name__)

SQUEUE_FORMAT = "%A %Q %T %r"


@dataclass(frozen=True)
class Queued:
    job_id: str
    priority: int
    state: str
    reason: str = ""

    @property
    def held(self) -> bool:
        """A held job (priority 0, or Slurm's JobHeld* reasons) competes for nothing until released."""
        return self.priority == 0 or self.reason.startswith("JobHeld")


def parse_queue(output: str) -> list[Queued]:
    """Parse the lines of ``SQUEUE_FORMAT``; a line that is not four such words is refused (logged)."""
    found = []
    for line in output.splitlines():
        if not line.strip():
            continue
        # The reason is last and may hold spaces ("ReqNodeNotAvail, UnavailableNodes:pre4").
        words = line.split(None, 3)
        if len(words) < 4 or not words[0].isdigit() or to_int(words[1], -1) < 0 or not words[2].isalpha():
            log.warning("squeue priority line refused: %r", line[:120])
            continue
        found.append(Queued(words[0], int(words[1]), words[2], words[3].strip()))
    return found


def outranked_by(job_id: str, queue: list[Queued]) -> tuple[Queued | None, Queued | None]:
    """``job_id``'s own entry (None: squeue did not list it, its priority is unknown) and the pending
    job, not held, of the highest priority at least its own (None: no such job)."""
    own = next((q for q in queue if q.job_id == job_id), None)
    if own is None:
        return None, None
    rivals = [q for q in queue if q.state == "PENDING" and not q.held and q.job_id != job_id]
    return own, max((q for q in rivals if q.priority >= own.priority), key=lambda q: q.priority, default=None)
