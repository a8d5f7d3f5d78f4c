"""The fallback decisions of the simulated watcher, over many runs at once.

Each decision is taken when a run has just been preempted and waits to run again (where the watcher
moves a pending job), from what the run itself has shown so far. Once moved, a run stays moved.

- ``after``: K preemptions.
- ``deadline``: the watcher's Uniform-Progress rule (``watch/deadline.py``, its constants), on the
  work saved so far over the time since submission.
- ``cost``: the measured overhead per preemption (everything held but not saved as work) times the
  live preemption rate makes a preemptible node-hour of useful work dearer than an on-demand one
  (the watcher's model and constants, ``watch/cost.py``).
- ``pending`` is decided where the run waits for capacity (``engine``), not here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slurm_preempt.simulate.spec import HOUR, JobSpec
from slurm_preempt.simulate.strategies import Strategy
from slurm_preempt.watch.cost import MIN_PREEMPTIONS as MIN_PREEMPTIONS_FOR_COST
from slurm_preempt.watch.cost import useful_share
from slurm_preempt.watch.deadline import MIN_SHARE_FOR_RATE

Array = Any  # numpy arrays; numpy's own types are not worth their weight here


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
    """``watch.deadline.behind`` for many runs: the same rule, margin and evidence."""
    assert spec.deadline_hours is not None
    deadline = spec.deadline_hours * HOUR
    now, done = state.now[rows], state.done[rows]
    left = deadline - now
    measured = (done > 0) & (now >= MIN_SHARE_FOR_RATE * deadline)
    with np.errstate(divide="ignore", invalid="ignore"):
        needs = (spec.work_seconds - done) / (done / now) * (1.0 + spec.policy.deadline_margin)
    return (left <= 0) | (measured & (needs > left))


def _dearer_than_on_demand(spec: JobSpec, state: Any, rows: Array, live_rate: Array) -> Array:
    preemptions = state.preemptions[rows]
    seen = preemptions >= MIN_PREEMPTIONS_FOR_COST
    overhead = (state.held_spot[rows] - state.done[rows]) / np.maximum(preemptions, 1)
    efficiency = useful_share(live_rate, overhead)
    with np.errstate(divide="ignore"):
        cost = np.where(efficiency > 0, spec.prices.ratio / efficiency, np.inf)
    return seen & (cost > 1.0)
