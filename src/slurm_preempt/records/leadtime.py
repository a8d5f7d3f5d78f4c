"""Lead time per notice source: how far ahead of the end of an attempt its notice really came.

Every notice the watcher writes is in the job's ledger with its source (``source_kind``) and the time
it was given. Its lead time is from then to the end of the attempt: the removal of the node, or the
job's own end when it left first (after its final checkpoint: then the figure is a lower bound of the
warning, and says how long the job needed). ``report`` shows, per source, the median and the worst
(shortest) lead time and how many final checkpoints were saved inside it.

The job side compares its own checkpoint time with the warning its notices give (``checkpoint_warning``):
a checkpoint that takes more than half the lead time may not finish before the node goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median

from slurm_preempt.records.attempts import Attempt, JobHistory, seconds_text

NOTICE_SOURCES = ("slurm", "together", "aws", "gcp", "azure")


@dataclass(frozen=True)
class Lead:
    """One notice and the end of its attempt."""

    source: str
    seconds: float
    final_inside: bool  # a final checkpoint saved after the notice, before the attempt ended


@dataclass(frozen=True)
class SourceLead:
    source: str
    notices: int
    median_seconds: float
    worst_seconds: float
    final_inside: int

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "notices": self.notices,
            "median_seconds": round(self.median_seconds, 1),
            "worst_seconds": round(self.worst_seconds, 1),
            "final_checkpoints_inside": self.final_inside,
        }


def attempt_lead(attempt: Attempt) -> Lead | None:
    """The lead time of the attempt's notice; None without a notice or an end."""
    given, end = attempt.notice_given, attempt.end
    if given is None or end is None or end < given:
        return None
    inside = any(given <= saved <= end for saved in attempt.final_checkpoints)
    return Lead(attempt.notice_source or "other", (end - given).total_seconds(), inside)


def leads_of(histories: Iterable[JobHistory]) -> list[Lead]:
    return [lead for h in histories for a in h.attempts if (lead := attempt_lead(a)) is not None]


def by_source(leads: Iterable[Lead]) -> list[SourceLead]:
    grouped: dict[str, list[Lead]] = {}
    for lead in leads:
        grouped.setdefault(lead.source, []).append(lead)
    return [
        SourceLead(
            source,
            len(found),
            median(lead.seconds for lead in found),
            min(lead.seconds for lead in found),
            sum(lead.final_inside for lead in found),
        )
        for source, found in sorted(grouped.items())
    ]


def lead_lines(rows: list[SourceLead]) -> list[str]:
    """The report's table (nothing when no notice was recorded)."""
    if not rows:
        return []
    lines = [
        "lead time per notice source (notice -> removal, or the job's own end when it left first):",
        f"{'source':<10} {'notices':>7} {'median':>8} {'worst':>8} {'final checkpoints inside':>25}",
    ]
    for row in rows:
        lines.append(
            f"{row.source:<10} {row.notices:>7} {seconds_text(row.median_seconds):>8} "
            f"{seconds_text(row.worst_seconds):>8} {f'{row.final_inside}/{row.notices}':>25}"
        )
    return lines


def checkpoint_warning(checkpoint_seconds: float, lead_seconds: float, source: str) -> str | None:
    """A line when one checkpoint takes more than half the warning the source gives, else None."""
    if lead_seconds <= 0 or checkpoint_seconds <= lead_seconds / 2:
        return None
    return (
        f"one checkpoint takes {seconds_text(checkpoint_seconds)}, more than half the "
        f"{seconds_text(lead_seconds)} a notice from {source} gives: the final checkpoint may not finish "
        "before the node goes (checkpoint less state, faster storage, or more often)"
    )
