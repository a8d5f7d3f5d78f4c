"""``fallback-deadline``: move a job to on-demand nodes once preemptible ones can no longer make it in time.

A Uniform-Progress rule ("Can't Be Late", NSDI 2024), taken when the job waits after a preemption
(where the watcher moves a pending job), from the job's own ledger:

- progress: the newest checkpoint saved with a step and a total (``Run(total_steps=...)``, or
  ``slurm-preempt resume progress DONE TOTAL`` from bash);
- its rate: steps saved per second since the job's first attempt started, so preemptions, restarts,
  waits and lost work all slow it down, as they will;
- the job is behind when the steps left at that rate, plus the margin (``MARGIN`` of that time),
  no longer fit before the deadline. Until a tenth of the time from the first start to the deadline
  has passed the rate says little (one early preemption would read as a crawl): then only a deadline
  already missed moves it.

Once moved a job stays moved (the watcher's fallback is once). Every figure read from the ledger is
the job owner's own data: it is checked (numbers, in range, not in the future) and a bad event is
skipped; it can only ever move the owner's own job. The simulator (``simulate/policies.py``) applies
the same rule to many simulated runs at once, with these constants.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from slurm_preempt.notice import from_text

MARGIN = 0.05  # reserve before the deadline, as a share of the time the work left needs
MIN_SHARE_FOR_RATE = 0.1  # of the time from the first start to the deadline
PROGRESS_KINDS = ("checkpoint_saved", "progress")


@dataclass(frozen=True)
class Progress:
    started: datetime  # the first attempt's start
    at: datetime  # when the newest progress was saved
    done: float
    total: float


def progress_of(events: Iterable[dict], now: datetime) -> Progress | None:
    """The job's progress from its (trusted) ledger events; None without a start or a total."""
    started, newest = None, None
    for event in events:
        when = event_time(event.get("time"))
        if when is None or when > now:
            continue
        if event.get("kind") == "attempt_start":
            started = when if started is None else min(started, when)
        elif event.get("kind") in PROGRESS_KINDS:
            figures = _figures(event)
            if figures is not None and (newest is None or when >= newest[0]):
                newest = (when, *figures)
    if started is None or newest is None or newest[0] < started:
        return None
    return Progress(started, newest[0], newest[1], newest[2])


def behind(
    progress: Progress | None, deadline: datetime, now: datetime, margin: float = MARGIN
) -> str | None:
    """Why the job must move to on-demand nodes now (a line for ``history``), or None."""
    left = (deadline - now).total_seconds()
    if left <= 0:
        return f"deadline {_clock(deadline)} passed: on-demand is its best chance"
    if progress is None or progress.done <= 0:
        return None
    elapsed = (progress.at - progress.started).total_seconds()
    if elapsed < MIN_SHARE_FOR_RATE * (deadline - progress.started).total_seconds():
        return None
    rate = progress.done / elapsed
    needs = (progress.total - progress.done) / rate * (1.0 + margin)
    if needs <= left:
        return None
    return (
        f"at {rate * 3600:.4g} steps/h since its first start ({progress.done:g} of {progress.total:g} saved) "
        f"it needs {needs / 3600:.2f} h with a {margin:.0%} margin, {left / 3600:.2f} h left before "
        f"fallback-deadline {_clock(deadline)}"
    )


def _figures(event: dict) -> tuple[float, float] | None:
    done, total = event.get("step"), event.get("total_steps")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (done, total)):
        return None
    assert isinstance(done, (int, float)) and isinstance(total, (int, float))
    if not (math.isfinite(done) and math.isfinite(total)) or total <= 0 or not 0 <= done <= total:
        return None
    return float(done), float(total)


def event_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return from_text(text)
    except (ValueError, OverflowError):
        return None


def _clock(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")
