"""The fallback decisions of the simulated watcher, over many runs at once.

Each decision is taken when a run has just been preempted and waits to run again (where the watcher
moves a pending job), from what the run itself has shown so far. Once moved, a run stays moved.

- ``after``: K preemptions.
- ``deadline`` (Uniform Progress, "Can't Be Late", NSDI 2024): at the progress rate measured on
  preemptible nodes so far (preemptions, restarts and lost work included), the work left plus one more
  restart no longer fits in the time left less the policy's margin (a share of the work left). Until
  the run has seen a few preemptions over a tenth of its time to the deadline its rate says little
  (three quick preemptions in the first hour would read as a crawl): until then it moves only when
  even on-demand nodes would no longer fit.
- ``cost``: the measured overhead per preemption (everything held but not saved as work) times the
  live preemption rate makes a preemptible node-hour of useful work dearer than an on-demand one.
- ``pending`` is decided where the run waits for capacity (``engine``), not here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slurm_preempt.simulate.spec import HOUR, JobSpec
from slurm_preempt.simulate.strategies import Strategy

Array = Any  # numpy arrays; numpy's own types are not worth their weight here

MIN_PREEMPTIONS_FOR_COST = 2  # one preemption says little about the overhead per preemption
MIN_PREEMPTIONS_FOR_RATE = 3  # nor do one or two about the rate of progress
MIN_SHARE_FOR_RATE = 0.1  # of the time from submission to the deadline


def decide(spec: JobSpec, strategy: Strategy, state: Any, rows: Array, live_rate: Array) -> Array:
    """Which of ``rows`` (preempted, still on preemptible nodes) move to on-demand now."""
    if strategy.fallback == "after":
        return state.preemptions[rows] >= spec.policy.fallback_after
    if strategy.fallback == "deadline":
        return _behind_deadline(spec, state, rows)
    if strategy.fallback == "cost":
        return _dearer_than_on_demand(spec, state, rows, live_rate)
    return np.zeros(rows.size, dtype=bool)


def _behind_deadline(spec: JobSpec, state: Any, rows: Array) -> Array:
    assert spec.deadline_hours is not None
    now, done = state.now[rows], state.done[rows]
    remaining = spec.work_seconds - done
    left = spec.deadline_hours * HOUR - now - spec.policy.deadline_margin * remaining
    restart = spec.restart_seconds[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        seen = (state.preemptions[rows] >= MIN_PREEMPTIONS_FOR_RATE) & (done > 0)
        measured = seen & (now >= MIN_SHARE_FOR_RATE * spec.deadline_hours * HOUR)
        rate = np.where(measured, done / now, np.nan)
        on_preemptible = restart + remaining / rate
    needs_known = np.isfinite(on_preemptible)
    return np.where(needs_known, on_preemptible > left, restart + remaining > left)


def _dearer_than_on_demand(spec: JobSpec, state: Any, rows: Array, live_rate: Array) -> Array:
    preemptions = state.preemptions[rows]
    seen = preemptions >= MIN_PREEMPTIONS_FOR_COST
    overhead = (state.held_spot[rows] - state.done[rows]) / np.maximum(preemptions, 1)
    efficiency = 1.0 - live_rate * overhead
    with np.errstate(divide="ignore"):
        cost = np.where(efficiency > 0, spec.prices.ratio / efficiency, np.inf)
    return seen & (cost > 1.0)
