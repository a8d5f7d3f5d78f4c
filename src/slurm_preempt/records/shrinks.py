"""A shrink (job/shrink.py) in the records: an event inside an attempt, never an attempt of its own.

The job writes ``shrunk`` (nodes before and after, when it was told, its final checkpoint, the shrink)
and then its command's ``resumed_from``: together the time the shrink cost. Accounting closes the job's
row as RESIZING at a shrink and opens a new one: ``fold_resizes`` makes them one attempt again.

Its counterpart, a grow-back (watch/growback.py), ends an attempt: the watcher's ``grow_back`` record
(root's) names the attempt's end cause, "grown back: 2 -> 3 nodes" (``grown``), which is no preemption.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from slurm_preempt.notice import from_text, to_text

if TYPE_CHECKING:
    from slurm_preempt.records.attempts import Attempt
    from slurm_preempt.slurm.sacct import AcctRecord


@dataclass
class Shrink:
    """The job went on without some nodes inside an attempt (job/shrink.py): no work lost, but no work
    done from its final checkpoint until the command ran again on the nodes that stayed."""

    nodes_before: str
    nodes_after: str
    noticed_at: datetime | None = None
    checkpoint_at: datetime | None = None
    shrunk_at: datetime | None = None
    running_again_at: datetime | None = None  # the command's resumed_from after the shrink

    @property
    def cost_seconds(self) -> float:
        """Idle time the shrink cost: final checkpoint -> running again (-> shrunk while not yet)."""
        begin, end = self.checkpoint_at or self.shrunk_at, self.running_again_at or self.shrunk_at
        return max(0.0, (end - begin).total_seconds()) if begin and end else 0.0

    def to_json(self) -> dict:
        def t(moment):
            return to_text(moment, "milliseconds") if moment else None

        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "noticed_at": t(self.noticed_at),
            "checkpoint_at": t(self.checkpoint_at),
            "shrunk_at": t(self.shrunk_at),
            "running_again_at": t(self.running_again_at),
            "cost_seconds": round(self.cost_seconds, 2),
        }


def _time(text: str) -> datetime | None:
    try:
        return from_text(text) if text else None
    except (ValueError, OverflowError):
        return None


def apply(attempt: Attempt, event: dict, moment: datetime) -> None:
    """A ``shrunk`` event inside the attempt; the ``resumed_from`` after it is its command running again."""
    if event["kind"] == "resumed_from":
        waiting = [
            s for s in attempt.shrinks if s.running_again_at is None and (s.shrunk_at or moment) <= moment
        ]
        if waiting:
            waiting[-1].running_again_at = moment
        return
    attempt.shrinks.append(
        Shrink(
            nodes_before=str(event.get("nodes_before", "")),
            nodes_after=str(event.get("nodes_after", "")),
            noticed_at=_time(str(event.get("noticed_at") or "")),
            checkpoint_at=_time(str(event.get("checkpoint_at") or "")),
            shrunk_at=_time(str(event.get("shrunk_at") or "")) or moment,
        )
    )
    attempt.notice_time = attempt.notice_time or attempt.shrinks[-1].noticed_at


def fold_resizes(rows: list[AcctRecord]) -> list[tuple[datetime, AcctRecord]]:
    """(start, row) of each attempt. A shrink closes the job's row as RESIZING and opens a new one for
    the same attempt (src/slurmctld/job_mgr.c: the resize is accounted as a new job record): such a row
    and the rows that follow it up to the first that is not RESIZING are one attempt, which started
    when the first of them did and ended as the last one did."""
    started = sorted(((r.start, r) for r in rows if r.start is not None), key=lambda pair: pair[0])
    folded: list[tuple[datetime, AcctRecord]] = []
    for start, row in started:
        if folded and folded[-1][1].state == "RESIZING":
            first, before = folded[-1]
            # The nodes and resources it started with; the state, exit code and end of the last row.
            folded[-1] = (first, replace(row, nodes=before.nodes, num_nodes=before.num_nodes,
                                         alloc_tres=before.alloc_tres))  # fmt: skip
        else:
            folded.append((start, row))
    return folded


def text(shrink: Shrink, clock: Callable[[datetime | None], str]) -> str:
    """One line of ``slurm-preempt history``."""
    from slurm_preempt.records.attempts import seconds_text

    return (
        f"shrank {shrink.nodes_before} -> {shrink.nodes_after} at {clock(shrink.shrunk_at)} (notice "
        f"{clock(shrink.noticed_at)}, checkpoint {clock(shrink.checkpoint_at)}, running again "
        f"{clock(shrink.running_again_at)}): idle {seconds_text(shrink.cost_seconds)}, no requeue"
    )


def grown(event: dict) -> str:
    """The end cause a watcher's ``grow_back`` record gives its attempt ("" for one not its shape)."""
    before, after = event.get("num_nodes_before"), event.get("nodes")
    counts = (before, after)
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 100_000 for n in counts):
        return ""
    return f"grown back: {before} -> {after} nodes"
