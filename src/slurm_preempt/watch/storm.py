"""``fallback-storm=N``: a job that was started N times in a row without saving a newer checkpoint.

Such a job is not making progress on these nodes (it dies while loading, its checkpoints fail, its
nodes go before it gets anywhere): requeueing it again only burns node-hours. When it waits after its
N-th such attempt the watcher moves it to its fallback constraint, once, with the reason in the
ledger (``history`` shows it), as for the other fallback policies.

From the job's ledger: the attempts' starts (the hooks', root's) and the steps of its checkpoints (the
job owner's events, checked: a whole number of steps, not in the future). The window is the last N
attempts (restart counts R-N to R-1 of a job now pending with restart count R); a storm when no
checkpoint saved since the window began has a step above the best one saved before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from slurm_preempt.watch.deadline import event_time


def storm(events: Iterable[dict], restart_count: int, attempts: int, now: datetime) -> str | None:
    """Why this job, pending with ``restart_count``, is in a restart storm (or None)."""
    if attempts <= 0 or restart_count < attempts:
        return None
    starts: dict[int, datetime] = {}
    saves: list[tuple[datetime, int]] = []
    for event in events:
        when = event_time(event.get("time"))
        if when is None or when > now:
            continue
        if event.get("kind") == "attempt_start":
            count = event.get("restart_count")
            if isinstance(count, int) and not isinstance(count, bool):
                starts[count] = min(when, starts.get(count, when))
        elif event.get("kind") == "checkpoint_saved":
            step = event.get("step")
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                saves.append((when, step))
    first = restart_count - attempts
    if first not in starts:
        return None  # the window's first attempt unrecorded: no judgement on missing facts
    began = starts[first]
    best_before = max((step for when, step in saves if when < began), default=-1)
    best_since = max((step for when, step in saves if when >= began), default=-1)
    if best_since > best_before:
        return None
    last = f"step {best_before}" if best_before >= 0 else "none"
    return (
        f"restart storm: {attempts} attempts in a row saved no newer checkpoint than before them "
        f"(newest: {last}; fallback-storm={attempts})"
    )
