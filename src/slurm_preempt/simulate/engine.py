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
  toolkit's notice (the latency of ``spec``, measured by default) the job computes until it is told,
  then takes a final checkpoint, which keeps that work too, and leaves, losing nothing, unless the
  preemption came unannounced or the checkpoint does not fit in the notice;
- between attempts the job waits (unpaid): Slurm's requeue hold, or the toolkit's fast restart, plus
  the capacity shortage after a mass drain; the watcher's fallback may then move it to on-demand.
- with a minimum of nodes under the job's (an elastic ``--nodes=MIN-MAX`` job, job/shrink.py), a told
  preemption of one node that is not the batch host (one chance in the width) and leaves at least MIN
  nodes shrinks the job in place: the final checkpoint, then the same attempt goes on one node fewer
  after the measured shrink restart, with no requeue or capacity wait, its periodic interval taken
  again for its fewer nodes (``Run(interval="auto")`` starts again on the survivors). Scaling is
  taken as linear: on ``w`` of ``n`` nodes the job computes at ``w / n`` of its speed, pays ``w``
  nodes and is preempted at ``w`` times the per-node rate. A requeue (at MIN, unannounced, a mass
  drain, the batch host) gives the next attempt all its nodes again;
- with grow-back, a shrunk job is also told, once the capacity of a node it lost is back (the refill
  time after the node's removal at the end of its notice), to take a final checkpoint and requeue:
  the watcher releases the hold at once and the next attempt runs at full width after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_preempt.errors import MissingDependencyError
from slurm_preempt.simulate import policies
from slurm_preempt.simulate.spec import HOUR, JobSpec
from slurm_preempt.simulate.strategies import Strategy, notice_usable, toolkit_interval

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
    shrinks: Array  # preemptions survived in place, on fewer nodes
    grows: Array  # requeues to grow back to full width once capacity was back
    grow_at: Array  # wall second at which a shrunk run's first removed node's capacity is back
    restarting: Array  # held seconds spent restarting (in the job's full node count)
    checkpointing: Array  # held seconds spent on periodic and final checkpoints
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
            shrinks=np.zeros(count, dtype=np.int64),
            grows=np.zeros(count, dtype=np.int64),
            grow_at=np.full(count, np.inf),
            restarting=zeros.copy(),
            checkpointing=zeros.copy(),
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
    width = np.full(rows.size, spec.nodes)
    runs.grow_at[rows] = np.inf  # every attempt starts at full width
    while rows.size:  # each pass, the runs that shrank in place go on, one node fewer
        rows, restart, width = _stretch(spec, strategy, runs, rows, restart, width, rng)


def _stretch(
    spec: JobSpec, strategy: Strategy, runs: Runs, rows: Array, restart: Array, width: Array, rng: Any
) -> tuple[Array, Array, Array]:
    """One stretch of an attempt on ``width`` nodes, from its restart to the end of the run, a requeue
    or a shrink; returns the runs that shrank, with their next restart and width.

    Linear scaling: on ``width`` of its nodes a job computes at ``width / nodes`` of its speed and pays
    ``width`` nodes, so what it holds is counted in the job's full node count (``speed`` of a second)."""
    speed = width / spec.nodes
    interval = _interval(spec, strategy, width)
    remaining = spec.work_seconds - runs.done[rows]
    computing = remaining / speed
    checkpoints = np.where(np.isfinite(interval), np.ceil(computing / _finite(interval)), 0.0)
    needed = restart + computing + checkpoints * spec.checkpoint_seconds
    until, mass = _time_to_preemption(spec, runs.now[rows], width, rng)
    until[runs.on_demand[rows]] = np.inf
    told = _told(spec, strategy, rows.size, rng)
    grow = runs.grow_at[rows] - runs.now[rows] < until  # capacity back before the next preemption
    until = np.where(grow, np.maximum(runs.grow_at[rows] - runs.now[rows], 0.0), until)
    told, mass = told | grow, mass & ~grow  # the watcher tells a job it grows back, as at a notice
    stop = until + np.where(told, spec.notice_latency_seconds, 0.0)  # a told job computes until told
    finish = stop >= needed
    _hold(runs, rows, np.where(finish, needed, 0.0) * speed)
    _overheads(
        runs, rows[finish], restart[finish], checkpoints[finish] * spec.checkpoint_seconds, speed[finish]
    )
    ended = rows[finish]
    runs.now[ended] += needed[finish]
    runs.done[ended] = spec.work_seconds
    runs.completed[ended] = True
    runs.active[ended] = False
    hit = ~finish
    nothing = np.zeros(0, dtype=np.int64)
    if not hit.any():
        return nothing, np.zeros(0), nothing
    preempted, told, grow, mass = rows[hit], told[hit], grow[hit], mass[hit]
    speed, restart, stop = speed[hit], restart[hit], stop[hit]
    computed = np.maximum(stop - restart, 0.0)
    saved_periodic, partial, checkpointing = _progress(computed, interval[hit], spec.checkpoint_seconds)
    saved = np.minimum(np.where(told, saved_periodic + partial, saved_periodic) * speed, remaining[hit])
    final = np.where(told & (computed > 0), spec.checkpoint_seconds, 0.0)
    held = stop + final
    _hold(runs, preempted, held * speed)
    _overheads(runs, preempted, np.minimum(restart, stop), checkpointing + final, speed)
    runs.done[preempted] += saved
    runs.preemptions[preempted] += ~grow
    runs.grows[preempted] += grow
    shrinks = _shrinks(spec, strategy, told & ~mass & ~grow, width[hit], rng)
    shrunk = preempted[shrinks]
    runs.shrinks[shrunk] += 1
    if strategy.grow_back:  # the node leaves at the end of its notice; its capacity returns later
        removed = runs.now[shrunk] + until[hit][shrinks] + spec.notice_seconds
        refill = rng.uniform(*spec.refill_minutes, shrunk.size) * 60.0
        runs.grow_at[shrunk] = np.minimum(runs.grow_at[shrunk], removed + refill)
    runs.now[shrunk] += held[shrinks]
    requeued, requeued_held = preempted[~shrinks], held[~shrinks]
    runs.now[requeued] += requeued_held + strategy.requeue_wait
    _wait_for_capacity(spec, strategy, runs, requeued, mass[~shrinks])
    _fall_back(spec, strategy, runs, preempted[~shrinks & ~grow])  # a grow-back is no preemption
    return shrunk, np.full(shrunk.size, spec.shrink_restart_seconds), width[hit][shrinks] - 1


def _interval(spec: JobSpec, strategy: Strategy, width: Array) -> Array:
    """Each run's periodic interval on its ``width`` nodes: the strategy's, or for a job whose
    ``Run(interval="auto")`` starts again on the survivors of a shrink, the same rule on fewer nodes."""
    if not strategy.adapts:
        return np.full(width.size, strategy.interval)
    intervals = np.full(width.size, strategy.interval)
    for nodes in np.unique(width[width != spec.nodes]):
        intervals[width == nodes] = toolkit_interval(spec, int(nodes))
    return intervals


def _finite(values: Array) -> Array:
    return np.where(np.isfinite(values), values, 1.0)


def _progress(computed: Array, interval: Array, checkpoint: float) -> tuple[Array, Array, Array]:
    """For ``computed`` seconds into segments of ``interval`` + ``checkpoint``: the work the periodic
    checkpoints saved, the work since (what a final checkpoint saves; up to the checkpoint under way)
    and the seconds spent checkpointing (the periodic ones and the one under way)."""
    finite = np.isfinite(interval)
    step = _finite(interval)
    periodic = np.where(finite, np.floor(computed / (step + checkpoint)), 0.0)
    into = computed - periodic * (step + checkpoint)
    partial = np.where(finite, np.minimum(into, step), computed)
    checkpointing = np.where(finite, periodic * checkpoint + np.maximum(into - step, 0.0), 0.0)
    return periodic * step, partial, checkpointing


def _shrinks(spec: JobSpec, strategy: Strategy, told: Array, width: Array, rng: Any) -> Array:
    """Which told preemptions the job survives in place: the node that leaves is not the batch host
    (one chance in ``width``) and at least the strategy's minimum of nodes stay (job/shrink.py)."""
    if strategy.min_nodes is None:  # no draw: the other strategies keep their figures exactly
        return np.zeros(told.size, dtype=bool)
    not_batch_host = rng.random(told.size) >= 1.0 / width
    return told & not_batch_host & (width - 1 >= strategy.min_nodes)


def _overheads(runs: Runs, rows: Array, restart: Array, checkpointing: Array, speed: Array) -> None:
    """What of the held time went to restarts and to checkpoints, in the job's full node count."""
    runs.restarting[rows] += restart * speed
    runs.checkpointing[rows] += checkpointing * speed


def _hold(runs: Runs, rows: Array, seconds: Array) -> None:
    """Count ``seconds`` of held nodes on the side each run is on."""
    on_demand = runs.on_demand[rows]
    runs.held_on_demand[rows] += np.where(on_demand, seconds, 0.0)
    runs.held_spot[rows] += np.where(on_demand, 0.0, seconds)


def _told(spec: JobSpec, strategy: Strategy, count: int, rng: Any) -> Array:
    """Which preemptions the job learns of in time for a final checkpoint."""
    if not strategy.notices or not notice_usable(spec):
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


def _mass_rate(spec: JobSpec, width: Any = None) -> Any:
    """Mass drains per second that take at least one of the job's ``width`` nodes (default: all)."""
    field = spec.field
    if field.mass_drain_hours is None:
        return 0.0
    nodes = spec.nodes if width is None else width
    return (1.0 - (1.0 - field.mass_drain_fraction) ** nodes) / (field.mass_drain_hours * HOUR)


def _time_to_preemption(spec: JobSpec, start: Array, width: Array, rng: Any) -> tuple[Array, Array]:
    """Seconds from ``start`` to the first preemption of the job's ``width`` nodes, and whether a mass
    drain did it."""
    until = _single(spec, start, width, rng, 1.0)
    jump = spec.field.jump_hour
    if jump is not None and spec.field.jump_factor != 1.0:
        jump_at = jump * HOUR
        before = start < jump_at
        crossed = before & (start + until >= jump_at)
        after_jump = _single(spec, np.maximum(start, jump_at), width, rng, spec.field.jump_factor)
        until = np.where(crossed, jump_at - start + after_jump, until)
        until = np.where(before, until, after_jump)
    if spec.field.mass_drain_hours is None:
        return until, np.zeros(start.size, dtype=bool)
    mass_until = rng.exponential(1.0 / _mass_rate(spec, width), start.size)
    return np.minimum(until, mass_until), mass_until < until


def _single(spec: JobSpec, start: Array, width: Array, rng: Any, factor: float) -> Array:
    """The first of the job's ``width`` nodes to be preempted, the rate times ``factor``."""
    gaps = spec.field.trace_gaps
    if not gaps:
        return rng.exponential(spec.field.mean_gap_seconds / (width * factor), start.size)
    # An attempt lands on nodes part-way through their gaps: the time to each one's next preemption
    # is the trace's residual life, survival Sr(x) = sum(max(g - x, 0)) / sum(g) (piecewise linear
    # between the gaps). The first of n nodes: P(min > x) = Sr(x)^n, so draw Sr(x) = u^(1/n).
    ordered = np.concatenate(([0.0], np.sort(np.asarray(gaps, dtype=float))))
    survival = np.array([np.maximum(ordered[1:] - x, 0.0).sum() for x in ordered]) / ordered.sum()
    drawn = rng.random(start.size) ** (1.0 / width)
    return np.interp(drawn, survival[::-1], ordered[::-1]) / factor
