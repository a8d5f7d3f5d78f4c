"""One job and the field it runs in, as ``slurm-preempt simulate`` takes them, checked once.

Every figure is validated here (finite, inside a sane range) so that the engine never sees a NaN, a
negative duration or an absurd value; each refusal is one ``UsageError`` line naming the option.

The toolkit's own figures are not inputs: they are what the benchmarks measured (README,
"Performance"; ``bench/bench_e2e.py`` and ``bench/bench_watcher.py``), kept here once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from slurm_preempt.errors import UsageError
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS
from slurm_preempt.records.prices import DEFAULT_DISCOUNT
from slurm_preempt.watch import deadline

# Measured (README "Performance", 2-core VM, Slurm 22.05.8): drain -> the job's handler, p99 of 20
# drains with the watcher's 1 s poll; requeue -> running again with the watcher's fast restart, and
# without it (Slurm's BeginTime hold, cred_expire + 1 = 121 s, then scheduling).
NOTICE_LATENCY_SECONDS = 0.86
FAST_RESTART_SECONDS = 2.9
SLURM_REQUEUE_HOLD_SECONDS = 177.0
# Measured (bench/bench_shrink.py, torchrun template, 3 -> 2 nodes, Slurm 22.05.8, shared 2-core VM
# under load, 2026-12-06): drain -> training again on the survivors in the same attempt, median of 3
# alternated rounds (19.4, 31.9, 26.9 s; --no-shrink's requeue in the same run: 31.7, 36.0, 43.6 s).
# It holds the notice latency and the example's sub-second final checkpoint, which the model also
# counts apart (slightly pessimistic), and the example's own start-up (imports, rendezvous, restore):
# a job whose start-up is longer should give its own figure (--shrink-restart-seconds).
SHRINK_RESTART_SECONDS = 26.9
# Grow-back (``--grow-back``): minutes from a node's removal until the provider's capacity is back (an
# idle matching node the watcher sees). 0, the model's own assumption elsewhere: a requeued job runs
# again at full width after the fast restart, so the pool is taken to have the nodes at once (and
# every drill here brings the node back within a second of its removal). A provider that refills
# later should be given as such (--refill-minutes 30, or 10-60).
REFILL_MINUTES = (0.0, 0.0)

HOUR = 3600.0
MAX_HOURS = 100_000.0  # ~11 years: anything longer is a typo
MAX_NODES = 100_000
MAX_SECONDS = 86_400.0  # one checkpoint, restart or notice longer than a day is a typo
MAX_RUNS = 1_000_000


@dataclass(frozen=True)
class Field:
    """How preemption behaves: a per-node mean time between preemptions, or gaps from a trace."""

    mtbp_hours: float | None = None  # per node
    trace_gaps: tuple[float, ...] = ()  # seconds between preemptions of one node, resampled
    jump_hour: float | None = None  # wall hour (from submission) at which the rate changes
    jump_factor: float = 1.0  # the rate is multiplied by this from jump_hour on
    mass_drain_hours: float | None = None  # mean time between correlated mass drains of the pool
    mass_drain_fraction: float = 0.5  # share of the preemptible nodes one mass drain takes
    capacity_wait_minutes: float = 0.0  # after a mass drain, how long no preemptible node is free
    unannounced: float = 0.05  # share of preemptions that come with no usable notice

    @property
    def mean_gap_seconds(self) -> float:
        if self.trace_gaps:
            return sum(self.trace_gaps) / len(self.trace_gaps)
        assert self.mtbp_hours is not None
        return self.mtbp_hours * HOUR


@dataclass(frozen=True)
class Prices:
    """Per node-hour; without an on-demand price the costs are in on-demand node-hours (1 each)."""

    on_demand: float | None = None
    preemptible: float | None = None
    discount: float = DEFAULT_DISCOUNT

    @property
    def ratio(self) -> float:
        """Preemptible over on-demand price per node-hour."""
        if self.on_demand is not None and self.preemptible is not None:
            return self.preemptible / self.on_demand
        return 1.0 - self.discount

    @property
    def unit(self) -> str:
        return "money" if self.on_demand is not None else "on-demand node-hours"

    @property
    def per_node_hour(self) -> float:
        return self.on_demand if self.on_demand is not None else 1.0


@dataclass(frozen=True)
class Policy:
    """The knobs of the fallback policies (as in a job's comment)."""

    fallback_after: int = 3
    fallback_pending_minutes: float = 10.0
    deadline_margin: float = deadline.MARGIN  # the watcher's own (watch/deadline.py)


@dataclass(frozen=True)
class JobSpec:
    work_hours: float
    nodes: int
    checkpoint_seconds: float
    restart_seconds: tuple[float, float]  # uniform between the two
    notice_seconds: float = DEFAULT_GRACE_SECONDS
    deadline_hours: float | None = None
    min_nodes: int | None = None  # shrink in place down to this many nodes; None: the job's nodes
    shrink_restart_seconds: float = SHRINK_RESTART_SECONDS  # final checkpoint -> computing on survivors
    grow_back: bool = False  # a shrunk job requeues at full width once a removed node's capacity is back
    refill_minutes: tuple[float, float] = REFILL_MINUTES  # removal -> capacity back, uniform between
    notice_latency_seconds: float = NOTICE_LATENCY_SECONDS  # drain -> the job told (it computes until)
    field: Field = Field(mtbp_hours=2.0)
    prices: Prices = Prices()
    policy: Policy = Policy()

    @property
    def work_seconds(self) -> float:
        return self.work_hours * HOUR

    @property
    def shrinks_to(self) -> int:
        """The fewest nodes the job goes on with in place (its node count: it never shrinks)."""
        return self.nodes if self.min_nodes is None else self.min_nodes

    def __post_init__(self) -> None:
        check_spec(self)


def number(option: str, value: Any, low: float, high: float, *, low_open: bool = True) -> float:
    """``value`` as a float inside (low, high] (or [low, high]), else a one-line UsageError."""
    try:
        figure = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} {value!r}: not a number") from None
    if not math.isfinite(figure):
        raise UsageError(f"{option} {value}: not a finite number")
    too_low = figure <= low if low_open else figure < low
    if too_low or figure > high:
        bound = f"more than {low:g}" if low_open else f"at least {low:g}"
        raise UsageError(f"{option} {value}: must be {bound} and at most {high:g}")
    return figure


def restart_range(text: str) -> tuple[float, float]:
    """``180`` or ``180-300`` (seconds) as a (low, high) pair."""
    return value_range("--restart-seconds", text, MAX_SECONDS, "180-300")


def value_range(option: str, text: str, high: float, example: str) -> tuple[float, float]:
    """``N`` or ``LOW-HIGH`` (each in [0, high]) as a (low, high) pair, else a one-line UsageError."""
    parts = str(text).strip().split("-")
    if len(parts) not in (1, 2) or not all(p.strip() for p in parts):
        raise UsageError(f"{option} {text!r}: give N or LOW-HIGH ({example})")
    low, top = (number(option, p, 0, high, low_open=False) for p in (parts * 2)[:2])
    if low > top:
        raise UsageError(f"{option} {text!r}: the low end is above the high end")
    return low, top


def check_spec(spec: JobSpec) -> None:
    number("--work-hours", spec.work_hours, 0, MAX_HOURS)
    number("--nodes", spec.nodes, 0, MAX_NODES)
    if int(spec.nodes) != spec.nodes:
        raise UsageError(f"--nodes {spec.nodes}: a whole number of nodes")
    number("--checkpoint-seconds", spec.checkpoint_seconds, 0, MAX_SECONDS, low_open=False)
    for value in spec.restart_seconds:
        number("--restart-seconds", value, 0, MAX_SECONDS, low_open=False)
    number("--notice-seconds", spec.notice_seconds, 0, MAX_SECONDS, low_open=False)
    _check_shrink(spec)
    if spec.deadline_hours is not None:
        if math.isfinite(spec.deadline_hours) and spec.deadline_hours <= 0:
            raise UsageError(f"--deadline-hours {spec.deadline_hours:g}: the deadline is in the past")
        number("--deadline-hours", spec.deadline_hours, 0, MAX_HOURS)
    _check_field(spec.field)
    _check_prices(spec.prices)
    _check_policy(spec.policy)


def _check_shrink(spec: JobSpec) -> None:
    number("--shrink-restart-seconds", spec.shrink_restart_seconds, 0, MAX_SECONDS, low_open=False)
    number("notice latency", spec.notice_latency_seconds, 0, MAX_SECONDS, low_open=False)
    low, high = spec.refill_minutes
    for value in (low, high):
        number("--refill-minutes", value, 0, MAX_HOURS * 60, low_open=False)
    if low > high:
        raise UsageError(f"--refill-minutes {low:g}-{high:g}: the low end is above the high end")
    if spec.min_nodes is not None:
        number("--min-nodes", spec.min_nodes, 0, MAX_NODES)
        if int(spec.min_nodes) != spec.min_nodes:
            raise UsageError(f"--min-nodes {spec.min_nodes}: a whole number of nodes")
        if spec.min_nodes > spec.nodes:
            raise UsageError(f"--min-nodes {spec.min_nodes}: more than the job's --nodes {spec.nodes}")
    if spec.grow_back and spec.shrinks_to >= spec.nodes:
        raise UsageError("--grow-back needs --min-nodes under --nodes (only a shrunk job grows back)")


def _check_field(field: Field) -> None:
    if field.trace_gaps:
        if field.mtbp_hours is not None:
            raise UsageError("--mtbp and --trace: give one of them")
    elif field.mtbp_hours is None:
        raise UsageError("give --mtbp HOURS (mean time between preemptions of one node) or --trace FILE")
    else:
        number("--mtbp", field.mtbp_hours, 0, MAX_HOURS)
        if field.mtbp_hours * HOUR < 1:
            raise UsageError(f"--mtbp {field.mtbp_hours:g}: under one second between preemptions")
    if field.jump_hour is not None:
        number("--rate-jump (hour)", field.jump_hour, 0, MAX_HOURS, low_open=False)
    number("--rate-jump (factor)", field.jump_factor, 0, 1000)
    if field.mass_drain_hours is not None:
        number("--mass-drain-hours", field.mass_drain_hours, 0, MAX_HOURS)
    number("--mass-drain-fraction", field.mass_drain_fraction, 0, 1)
    number("--capacity-wait-minutes", field.capacity_wait_minutes, 0, MAX_HOURS * 60, low_open=False)
    number("--unannounced", field.unannounced, 0, 1, low_open=False)


def _check_prices(prices: Prices) -> None:
    number("--discount", prices.discount, 0, 1, low_open=False)
    for option, value in (
        ("--price-on-demand", prices.on_demand),
        ("--price-preemptible", prices.preemptible),
    ):
        if value is not None:
            number(option, value, 0, 1e9)
    if prices.preemptible is not None and prices.on_demand is None:
        raise UsageError("--price-preemptible needs --price-on-demand too")


def _check_policy(policy: Policy) -> None:
    number("--fallback-after", policy.fallback_after, 0, 10_000)
    number("--fallback-pending-minutes", policy.fallback_pending_minutes, 0, MAX_HOURS * 60)
    number("--deadline-margin", policy.deadline_margin, 0, 0.9, low_open=False)


def check_runs(runs: int) -> int:
    number("--runs", runs, 0, MAX_RUNS)
    return int(runs)
