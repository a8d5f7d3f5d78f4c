"""Many seeded runs of one job under one strategy, all advanced together one attempt at a time.

The model (the same as Daly's, 2006, plus what a notice and a watcher change):

- an attempt starts with a restart (drawn between the two restart figures; none for the first), then
  computes in segments of ``interval`` seconds each closed by a checkpoint; the job's nodes are paid
  for from the attempt's start to its end;
- each node is preempted at its own rate (Poisson, or the residual life of a trace's gaps; times the
  jump factor from the jump hour on), plus correlated mass drains that take a share of the pool at
  once and leave no preemptible capacity for a while; preemptions during restarts and checkpoints
  count too;
- without a notice, a preemption loses everything since the last completed checkpoint; with the
  toolkit's notice (the measured latency) the job takes a final checkpoint and leaves, losing
  nothing, unless the preemption came unannounced or the checkpoint does not fit in the notice;
- between attempts the job waits (unpaid): Slurm's requeue hold, or the toolkit's fast restart, plus
  the capacity shortage after a mass drain; the watcher's fallback may then move it to on-demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_preempt.errors import MissingDependencyError
from slurm_preempt.simulate import policies
from slurm_preempt.simulate.spec import HOUR, NOTICE_LATENCY_SECONDS, JobSpec
from slurm_preempt.simulate.strategies import Strategy

try:
    import numpy as np
except ImportError:  # pragma: no cover - the [simulate] extra is installed with [dev]
    np = None  # type: ignore[assignment]

Array = Any
MAX_ATTEMPTS = 200_000
GIVE_UP_FACTOR = 1000.0  # a run still going after this many times its work is counted as never done


@dataclass
class Runs:
    """The state of every run, one array entry per run."""

    now: Array  # wall seconds since submission
    done: Array  # work seconds saved
    held_spot: Array  # seconds the job held preemptible nodes
    held_on_demand: Array
    preemptions: Array
    on_demand: Array  # moved (or started) on standard nodes
    moved: Array
    active: Array
    completed: Array

    @classmethod
    def start(cls, count: int, on_demand: bool) -> Runs:
        zeros = np.zeros(count)
        return cls(
            now=zeros.copy(),
            done=zeros.copy(),
            held_spot=zeros.copy(),
            held_on_demand=zeros.copy(),
            preemptions=np.zeros(count, dtype=np.int64),
            on_demand=np.full(count, on_demand),
            moved=np.zeros(count, dtype=bool),
            active=np.ones(count, dtype=bool),
            completed=np.zeros(count, dtype=bool),
        )


def simulate(spec: JobSpec, strategy: Strategy, count: int, seed: int) -> Runs:
    """``count`` runs of ``spec`` under ``strategy``, reproducible from ``seed``."""
    if np is None:
        raise MissingDependencyError(
            "slurm-preempt simulate needs numpy: pip install 'slurm-preempt[simulate]'"
        )
    rng = np.random.default_rng(seed)
    runs = Runs.start(count, strategy.on_demand)
    give_up = spec.work_seconds * GIVE_UP_FACTOR
    for attempt in range(MAX_ATTEMPTS):
        rows = np.flatnonzero(runs.active)
        if rows.size == 0:
            break
        _attempt(spec, strategy, runs, rows, rng, first=attempt == 0)
        runs.active &= runs.now < give_up
    runs.active[:] = False
    return runs


def _attempt(spec: JobSpec, strategy: Strategy, runs: Runs, rows: Array, rng: Any, first: bool) -> None:
    low, high = spec.restart_seconds
    restart = np.zeros(rows.size) if first else rng.uniform(low, high, rows.size)
    remaining = spec.work_seconds - runs.done[rows]
    segment = strategy.interval + spec.checkpoint_seconds
    checkpoints = (
        np.zeros(rows.size) if np.isinf(strategy.interval) else np.ceil(remaining / strategy.interval)
    )
    needed = restart + remaining + checkpoints * spec.checkpoint_seconds
    until, mass = _time_to_preemption(spec, runs.now[rows], rng)
    until[runs.on_demand[rows]] = np.inf
    finish = until >= needed
    _hold(runs, rows, np.where(finish, needed, 0.0))
    ended = rows[finish]
    runs.now[ended] += needed[finish]
    runs.done[ended] = spec.work_seconds
    runs.completed[ended] = True
    runs.active[ended] = False
    hit = ~finish
    if not hit.any():
        return
    computed = np.maximum(until[hit] - restart[hit], 0.0)
    periodic = np.floor(computed / segment) if np.isfinite(segment) else np.zeros(computed.size)
    saved_periodic = periodic * strategy.interval if np.isfinite(segment) else periodic
    told = _told(spec, strategy, computed.size, rng)
    partial = (
        np.minimum(computed - periodic * segment, strategy.interval) if np.isfinite(segment) else computed
    )
    saved = np.minimum(np.where(told, saved_periodic + partial, saved_periodic), remaining[hit])
    final = np.where(told & (computed > 0), NOTICE_LATENCY_SECONDS + spec.checkpoint_seconds, 0.0)
    held = until[hit] + final
    preempted = rows[hit]
    _hold(runs, preempted, held)
    runs.done[preempted] += saved
    runs.preemptions[preempted] += 1
    runs.now[preempted] += held + strategy.requeue_wait
    _wait_for_capacity(spec, strategy, runs, preempted, mass[hit])
    _fall_back(spec, strategy, runs, preempted)


def _hold(runs: Runs, rows: Array, seconds: Array) -> None:
    """Count ``seconds`` of held nodes on the side each run is on."""
    on_demand = runs.on_demand[rows]
    runs.held_on_demand[rows] += np.where(on_demand, seconds, 0.0)
    runs.held_spot[rows] += np.where(on_demand, 0.0, seconds)


def _told(spec: JobSpec, strategy: Strategy, count: int, rng: Any) -> Array:
    """Which preemptions the job learns of in time for a final checkpoint."""
    if not strategy.notices or NOTICE_LATENCY_SECONDS + spec.checkpoint_seconds > spec.notice_seconds:
        return np.zeros(count, dtype=bool)
    return rng.random(count) >= spec.field.unannounced


def _wait_for_capacity(spec: JobSpec, strategy: Strategy, runs: Runs, rows: Array, mass: Array) -> None:
    wait = np.where(mass, spec.field.capacity_wait_minutes * 60.0, 0.0)
    if strategy.fallback == "pending":
        limit = spec.policy.fallback_pending_minutes * 60.0
        move = wait > limit
        wait = np.minimum(wait, limit)
        _move(runs, rows[move])
    runs.now[rows] += wait


def _fall_back(spec: JobSpec, strategy: Strategy, runs: Runs, rows: Array) -> None:
    if strategy.fallback is None:
        return
    candidates = rows[~runs.on_demand[rows]]
    if candidates.size:
        live = _job_rate(spec, runs.now[candidates]) + _mass_rate(spec)
        _move(runs, candidates[policies.decide(spec, strategy, runs, candidates, live)])


def _move(runs: Runs, rows: Array) -> None:
    runs.moved[rows] |= ~runs.on_demand[rows]
    runs.on_demand[rows] = True


def _job_rate(spec: JobSpec, now: Array) -> Array:
    """Preemptions per second of the job's nodes (single ones) at wall time ``now``."""
    base = spec.nodes / spec.field.mean_gap_seconds
    if spec.field.jump_hour is None:
        return np.full(now.size, base)
    return np.where(now >= spec.field.jump_hour * HOUR, base * spec.field.jump_factor, base)


def _mass_rate(spec: JobSpec) -> float:
    field = spec.field
    if field.mass_drain_hours is None:
        return 0.0
    return (1.0 - (1.0 - field.mass_drain_fraction) ** spec.nodes) / (field.mass_drain_hours * HOUR)


def _time_to_preemption(spec: JobSpec, start: Array, rng: Any) -> tuple[Array, Array]:
    """Seconds from each attempt's start to its first preemption, and whether a mass drain did it."""
    until = _single(spec, start, rng, 1.0)
    jump = spec.field.jump_hour
    if jump is not None and spec.field.jump_factor != 1.0:
        jump_at = jump * HOUR
        before = start < jump_at
        crossed = before & (start + until >= jump_at)
        after_jump = _single(spec, np.maximum(start, jump_at), rng, spec.field.jump_factor)
        until = np.where(crossed, jump_at - start + after_jump, until)
        until = np.where(before, until, after_jump)
    mass_rate = _mass_rate(spec)
    if mass_rate <= 0:
        return until, np.zeros(start.size, dtype=bool)
    mass_until = rng.exponential(1.0 / mass_rate, start.size)
    return np.minimum(until, mass_until), mass_until < until


def _single(spec: JobSpec, start: Array, rng: Any, factor: float) -> Array:
    """The first of the job's nodes to be preempted, the rate times ``factor``."""
    gaps = spec.field.trace_gaps
    if not gaps:
        return rng.exponential(spec.field.mean_gap_seconds / (spec.nodes * factor), start.size)
    # An attempt lands on nodes part-way through their gaps: the time to each one's next preemption
    # is the trace's residual life, survival Sr(x) = sum(max(g - x, 0)) / sum(g) (piecewise linear
    # between the gaps). The first of n nodes: P(min > x) = Sr(x)^n, so draw Sr(x) = u^(1/n).
    ordered = np.concatenate(([0.0], np.sort(np.asarray(gaps, dtype=float))))
    survival = np.array([np.maximum(ordered[1:] - x, 0.0).sum() for x in ordered]) / ordered.sum()
    drawn = rng.random(start.size) ** (1.0 / spec.nodes)
    return np.interp(drawn, survival[::-1], ordered[::-1]) / factor
