"""What the runs of each strategy come to: cost per completed run, completion times, deadline misses."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from slurm_preempt.simulate import engine
from slurm_preempt.simulate.engine import np
from slurm_preempt.simulate.spec import (
    FAST_RESTART_SECONDS,
    HOUR,
    NOTICE_LATENCY_SECONDS,
    REFILL_MINUTES,
    SHRINK_RESTART_SECONDS,
    SLURM_REQUEUE_HOLD_SECONDS,
    JobSpec,
)
from slurm_preempt.simulate.strategies import Strategy, strategies


@dataclass(frozen=True)
class Summary:
    name: str
    label: str
    runs: int
    completed: int
    cost: float | None  # per completed run, in spec.prices' unit
    cost_fraction: float | None  # of on-demand only
    median_hours: float | None
    p95_hours: float | None
    miss_probability: float | None  # of the deadline (not completing counts as a miss)
    mean_preemptions: float
    moved_share: float
    interval_seconds: float | None  # periodic checkpoints; None: only at notices
    mean_shrinks: float  # preemptions survived in place on fewer nodes, per run
    mean_grows: float  # requeues to grow back to full width, per run
    held_shares: dict[str, float]  # of the node-hours held: work, checkpoints, restarts, lost work


def held_shares(spec: JobSpec, runs: engine.Runs) -> dict[str, float]:
    """Where the node-hours held went (both sides, in the job's full node count): the work itself,
    periodic and final checkpoints, restarts, and the rest: work computed and lost at a preemption."""
    held = float((runs.held_spot + runs.held_on_demand).sum())
    if held <= 0:
        return {"work": 0.0, "checkpoints": 0.0, "restarts": 0.0, "lost": 0.0}
    work, checkpoints = float(runs.done.sum()), float(runs.checkpointing.sum())
    restarts = float(runs.restarting.sum())
    return {
        "work": work / held,
        "checkpoints": checkpoints / held,
        "restarts": restarts / held,
        "lost": max(held - work - checkpoints - restarts, 0.0) / held,
    }


def on_demand_cost(spec: JobSpec) -> float:
    return spec.work_hours * spec.nodes * spec.prices.per_node_hour


def summarise(spec: JobSpec, strategy: Strategy, runs: engine.Runs) -> Summary:
    count, completed = runs.done.size, int(runs.completed.sum())
    node_hours = (runs.held_spot * spec.prices.ratio + runs.held_on_demand) * spec.nodes / HOUR
    cost = float(node_hours.sum() * spec.prices.per_node_hour / completed) if completed else None
    walls = runs.now[runs.completed] / HOUR
    miss = None
    if spec.deadline_hours is not None:
        miss = float(np.mean(~runs.completed | (runs.now > spec.deadline_hours * HOUR)))
    return Summary(
        name=strategy.name,
        label=strategy.label,
        runs=count,
        completed=completed,
        cost=cost,
        cost_fraction=None if cost is None else cost / on_demand_cost(spec),
        median_hours=float(np.median(walls)) if completed else None,
        p95_hours=float(np.quantile(walls, 0.95)) if completed == count else None,
        miss_probability=miss,
        mean_preemptions=float(runs.preemptions.mean()),
        moved_share=float(runs.moved.mean()),
        interval_seconds=None if math.isinf(strategy.interval) else strategy.interval,
        mean_shrinks=float(runs.shrinks.mean()),
        mean_grows=float(runs.grows.mean()),
        held_shares=held_shares(spec, runs),
    )


def run_all(spec: JobSpec, count: int, seed: int) -> list[Summary]:
    """Every strategy of ``spec``, each over ``count`` runs from the same seed."""
    return [summarise(spec, s, engine.simulate(spec, s, count, seed)) for s in strategies(spec)]


def to_json(spec: JobSpec, summaries: list[Summary], count: int, seed: int) -> dict[str, Any]:
    return {
        "job": _spec_json(spec),
        "runs": count,
        "seed": seed,
        "cost_unit": spec.prices.unit,
        "on_demand_cost": on_demand_cost(spec),
        "measured": {  # README "Performance": what the toolkit's rows rest on
            "notice_latency_seconds": NOTICE_LATENCY_SECONDS,
            "fast_restart_seconds": FAST_RESTART_SECONDS,
            "slurm_requeue_hold_seconds": SLURM_REQUEUE_HOLD_SECONDS,
            "shrink_restart_seconds_default": SHRINK_RESTART_SECONDS,
            "refill_minutes_default": list(REFILL_MINUTES),
        },
        "strategies": [asdict(s) for s in summaries],
    }


def _spec_json(spec: JobSpec) -> dict[str, Any]:
    data = asdict(spec)
    gaps = data["field"].pop("trace_gaps")
    data["field"]["trace_gap_count"] = len(gaps)
    data["field"]["mean_gap_hours"] = spec.field.mean_gap_seconds / HOUR
    return data


def table(spec: JobSpec, summaries: list[Summary], count: int, seed: int) -> str:
    """The comparison as aligned text for people."""
    head = ["strategy", "cost/run", "x on-demand", "median h", "p95 h", "preempted", "moved", "ckpt every"]
    if spec.deadline_hours is not None:
        head.insert(5, "P(miss)")
    if spec.shrinks_to < spec.nodes:
        head.insert(-2, "shrunk")
    if spec.grow_back:
        head.insert(-2, "grown")
    rows = [head] + [_row(spec, s) for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([_heading(spec, count, seed), *lines, _footnote(spec)])


def _row(spec: JobSpec, s: Summary) -> list[str]:
    row = [
        s.label,
        _fmt(s.cost, "{:.1f}"),
        _fmt(s.cost_fraction, "{:.3f}"),
        _fmt(s.median_hours, "{:.1f}"),
        _fmt(s.p95_hours, "{:.1f}"),
        f"{s.mean_preemptions:.1f}",
        f"{s.moved_share:.0%}",
        _interval(s),
    ]
    if spec.deadline_hours is not None:
        row.insert(5, _fmt(s.miss_probability, "{:.1%}"))
    if spec.shrinks_to < spec.nodes:
        row.insert(-2, f"{s.mean_shrinks:.1f}")
    if spec.grow_back:
        row.insert(-2, f"{s.mean_grows:.1f}")
    return row


def _interval(s: Summary) -> str:
    if s.interval_seconds is not None:
        return f"{s.interval_seconds:.0f} s"
    return "never" if s.name == "on-demand" else "at notices"


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _heading(spec: JobSpec, count: int, seed: int) -> str:
    field = spec.field
    rate = f"trace of {len(field.trace_gaps)} gaps" if field.trace_gaps else f"mtbp {field.mtbp_hours:g} h"
    deadline = f", deadline {spec.deadline_hours:g} h" if spec.deadline_hours is not None else ""
    low, high = spec.restart_seconds
    restart = f"{low:g}" if low == high else f"{low:g}-{high:g}"
    shrink = (
        f", shrinks in place to {spec.shrinks_to} (restart {spec.shrink_restart_seconds:g} s, linear scaling)"
        if spec.shrinks_to < spec.nodes
        else ""
    )
    low_refill, high_refill = spec.refill_minutes
    refill = f"{low_refill:g}" if low_refill == high_refill else f"{low_refill:g}-{high_refill:g}"
    grow = f", grows back {refill} min after a removal" if spec.grow_back else ""
    return (
        f"{spec.nodes}-node job, {spec.work_hours:g} h of work, checkpoint {spec.checkpoint_seconds:g} s, "
        f"restart {restart} s, notice {spec.notice_seconds:g} s, {rate} per node{deadline}{shrink}{grow}; "
        f"{count} runs, seed {seed}"
    )


def _footnote(spec: JobSpec) -> str:
    prices = spec.prices
    if prices.on_demand is None:
        unit = f"cost in on-demand node-hours, preemptible at {prices.ratio:.0%} (assumed discount)"
    else:
        unit = f"cost at {prices.on_demand:g} per on-demand node-hour, preemptible at {prices.ratio:.0%}"
    latency = f"{spec.notice_latency_seconds:g} s" + (
        " (measured)" if spec.notice_latency_seconds == NOTICE_LATENCY_SECONDS else ""
    )
    return (
        f"{unit}; p95 '-' when some runs never finished; unannounced preemptions "
        f"{spec.field.unannounced:.0%}; notice latency {latency}"
    )
