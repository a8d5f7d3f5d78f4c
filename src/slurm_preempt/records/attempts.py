"""A job's attempts as the records tell them, and the one count of work lost.

An attempt is one run of the job between a start and an end; its number is Slurm's restart count.
``records/history.py`` builds them from the restart ledger and ``sacct -D``.

Work lost (``Attempt.lost_seconds``, the one definition that history, the timeline and the report
use; ``seconds_text`` is its one rounding) = attempt end minus the last durable checkpoint saved in it
(the whole attempt when none); nothing for a completed attempt, and nothing after a final checkpoint:
the job saved it because it was leaving, so what follows is the job leaving, not work redone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from slurm_preempt.notice import to_text
from slurm_preempt.records.shrinks import Shrink

# sacct state -> (cause label, counts as a preemption)
ACCT_CAUSES = {
    "COMPLETED": ("completed", False),
    "FAILED": ("failed", False),
    "CANCELLED": ("cancelled", False),
    "TIMEOUT": ("time limit", False),
    "NODE_FAIL": ("node failure (preempted)", True),
    "PREEMPTED": ("preempted", True),
    "REQUEUED": ("requeued", False),
    "BOOT_FAIL": ("boot failure", False),
    "OUT_OF_MEMORY": ("out of memory", False),
    "DEADLINE": ("deadline", False),
}
PREEMPTED_CAUSES = {"node failure (preempted)", "preempted", "requeued after notice"}
# Slurm 22.05 gives the epilogs exit code 0:0 for a job that completed, was cancelled or hit its time
# limit (all three captured here): without accounting we say so rather than guess.
ENDED_ZERO = "completed, cancelled or timed out"
FINISHED_CAUSES = {"completed", ENDED_ZERO}


@dataclass
class Attempt:
    number: int  # Slurm's restart count
    nodes: list[str] = field(default_factory=list)
    start: datetime | None = None
    end: datetime | None = None
    cause: str = "running"
    exit_code: str = ""
    cpus: int = 0
    gpus: int = 0
    notice_time: datetime | None = None
    deadline: datetime | None = None
    notice_by: str = ""  # who wrote its notice_sent event (ledger.written_by): root, writer, owner
    notice_source: str = ""  # the source of its notice (slurm, together, aws, gcp, azure)
    notice_given: datetime | None = None  # when the notice was written (the ledger's time of it)
    checkpoints: list[datetime] = field(default_factory=list)
    final_checkpoints: list[datetime] = field(default_factory=list)  # saved because the job was leaving
    intervals: list[float] = field(default_factory=list)  # checkpoint intervals taken (interval="auto")
    wait_before: float | None = None  # seconds since the previous attempt ended
    node_epilogs: dict[str, datetime] = field(default_factory=dict)  # node -> when its epilog ran
    source: str = "ledger"  # or "ledger+sacct" / "sacct"
    controller_ended: bool = False  # EpilogSlurmctld recorded its end (once per attempt)
    shrinks: list[Shrink] = field(default_factory=list)  # nodes given back inside this attempt
    grown: str = ""  # told to requeue to come back larger (records.shrinks.grown): its end cause

    @property
    def preempted(self) -> bool:
        return self.cause in PREEMPTED_CAUSES

    @property
    def run_seconds(self) -> float:
        if self.start is None or self.end is None:
            return 0.0
        return max(0.0, (self.end - self.start).total_seconds())

    @property
    def last_checkpoint(self) -> datetime | None:
        before = [c for c in self.checkpoints if self.end is None or c <= self.end]
        return max(before) if before else None

    @property
    def lost_seconds(self) -> float:
        """Work this attempt did that a later one must do again (see the module's docstring)."""
        if self.end is None or self.start is None or self.cause in FINISHED_CAUSES:
            return 0.0
        last = self.last_checkpoint
        if last is not None and last in self.final_checkpoints:
            return 0.0
        return max(0.0, (self.end - (last or self.start)).total_seconds())

    def to_json(self) -> dict:
        def t(moment):
            return to_text(moment) if moment else None

        return {
            "attempt": self.number,
            "nodes": self.nodes,
            "start": t(self.start),
            "end": t(self.end),
            "cause": self.cause,
            "exit_code": self.exit_code,
            "cpus": self.cpus,
            "gpus": self.gpus,
            "run_seconds": round(self.run_seconds, 1),
            "notice_time": t(self.notice_time),
            "deadline": t(self.deadline),
            "notice_by": self.notice_by or None,
            "notice_source": self.notice_source or None,
            "notice_given": t(self.notice_given),
            "checkpoints": [t(c) for c in self.checkpoints],
            "last_checkpoint": t(self.last_checkpoint),
            "checkpoint_intervals": self.intervals,
            "lost_seconds": round(self.lost_seconds, 1),
            "wait_before_seconds": None if self.wait_before is None else round(self.wait_before, 1),
            "source": self.source,
            "shrinks": [shrink.to_json() for shrink in self.shrinks],
        }


@dataclass
class JobHistory:
    job_id: str
    user: str = ""
    partition: str = ""
    constraints: str = ""
    submit: datetime | None = None
    attempts: list[Attempt] = field(default_factory=list)
    accounting: bool = False
    ignored_events: int = 0  # events present but not trusted (forged or unreadable kinds)
    checkpoint_seconds: list[float] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what the watcher could not fix by itself
    events_by: dict[str, int] = field(default_factory=dict)  # believed events by writer: root, writer, owner
    moves: list[str] = field(default_factory=list)  # the watcher's fallback moves, with their reasons

    @property
    def lost_seconds(self) -> float:
        return sum(a.lost_seconds for a in self.attempts)

    @property
    def shrink_seconds(self) -> float:
        return sum(s.cost_seconds for a in self.attempts for s in a.shrinks)

    def to_json(self) -> dict:
        return {
            "job_id": self.job_id,
            "warnings": self.warnings,
            "moves": self.moves,
            "user": self.user,
            "partition": self.partition,
            "constraints": self.constraints,
            "submit": to_text(self.submit) if self.submit else None,
            "accounting": self.accounting,
            "ignored_events": self.ignored_events,
            "events_by": self.events_by,
            "lost_seconds": round(self.lost_seconds, 1),
            "shrink_seconds": round(self.shrink_seconds, 1),
            "attempts": [a.to_json() for a in self.attempts],
        }


def seconds_text(seconds: float) -> str:
    """A duration, compact: 0s, 0.2s, 45s, 2m05s, 1h02m. The one rounding of work lost, wherever shown."""
    if 0 < seconds < 10 and round(seconds, 1) > 0:
        return f"{seconds:.1f}s"
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def clock_text(moment: datetime | None) -> str:
    """A moment as history and report print it (UTC, to the second); ``-`` when not known."""
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"
