"""``fallback-cost``: move a job to on-demand nodes once a completed run costs more on preemptible ones.

The cost model is the simulator's (``simulate/policies.py`` imports it from here): a preemptible
node-hour costs ``price_ratio`` of an on-demand one, and of the time a job holds preemptible nodes a
share ``1 - rate x overhead`` is work it keeps, where ``rate`` is its preemptions per second (the live
per-node rate of its pool times its nodes) and ``overhead`` the seconds each preemption costs it. A
completed run then costs ``price_ratio / useful_share`` of what it costs on-demand; past one (or one
plus the job's margin) the job moves.

The overhead is the job's own, from its ledger, taken when it waits after a preemption (where the
watcher moves a pending job): everything it held but did not keep as work, over its preemptions
(Slurm's restart count):

- work lost: each attempt's end minus its last checkpoint (``records.attempts``, the one count of it;
  nothing after a final checkpoint);
- checkpoint cost: the seconds of every save (``checkpoint_saved``'s ``seconds``);
- restart overhead: from an attempt's start (the prolog's ``attempt_start``) to its resume from a
  checkpoint (``resumed_from``), in attempts that saved again (in one that did not, that time is
  already work lost).

Saves are not per preemption, but counted over the preemptions they come with and multiplied by the
rate they are close to their share of the time held, as in the simulator. Until
``MIN_PREEMPTIONS`` preemptions one says little about the overhead: no judgement. The job owner's
events are checked (numbers, finite, in range, not in the future) and a bad one skipped; they can
only ever move the owner's own job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slurm_preempt.records import history as histories
from slurm_preempt.records.attempts import FINISHED_CAUSES, Attempt
from slurm_preempt.records.prices import Prices
from slurm_preempt.watch.deadline import event_time

MIN_PREEMPTIONS = 2  # one preemption says little about the overhead per preemption
MAX_SAVE_SECONDS = 86400.0  # a save said to take longer is not believed
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def useful_share(rate: Any, overhead: Any) -> Any:
    """The share of held time kept as work: ``1 - rate x overhead`` (floats or numpy arrays)."""
    return 1.0 - rate * overhead


def cost_ratio(price_ratio: float, rate: float, overhead: float) -> float:
    """A completed run's cost on preemptible nodes over its cost on-demand (inf: it never completes)."""
    share = useful_share(rate, overhead)
    return price_ratio / share if share > 0 else math.inf


@dataclass(frozen=True)
class Overhead:
    preemptions: int
    lost: float  # seconds of work redone
    saves: float  # seconds spent saving checkpoints
    restarts: float  # seconds from an attempt's start to its resume

    @property
    def per_preemption(self) -> float:
        return (self.lost + self.saves + self.restarts) / max(self.preemptions, 1)

    def text(self) -> str:
        return (
            f"{self.per_preemption:.0f} s lost per preemption (work {self.lost:.0f} s, saves "
            f"{self.saves:.0f} s, restarts {self.restarts:.0f} s over {self.preemptions} preemptions)"
        )


def overhead_of(job_id: str, events: list[dict], preemptions: int, now: datetime) -> Overhead | None:
    """The job's overhead from its (trusted) ledger events; None without the facts to judge on."""
    if preemptions < MIN_PREEMPTIONS:
        return None
    past = [e for e in events if (when := event_time(e.get("time"))) is not None and when <= now]
    attempts = [a for a in histories.build(job_id, past).attempts if a.start is not None]
    if len(attempts) < 2:
        return None  # the hooks' starts unrecorded: no judgement on missing facts
    for attempt in attempts:
        # The job waits to run again: none of its attempts finished, whatever an exit code of 0:0
        # (Slurm 22.05 gives the epilog no job state) would otherwise let the ledger alone say.
        if attempt.cause in FINISHED_CAUSES and attempt.number < preemptions:
            attempt.cause = "requeued"
    lost = sum(a.lost_seconds for a in attempts)
    saves = sum(_save_seconds(e) for e in past if e.get("kind") == "checkpoint_saved")
    return Overhead(preemptions, lost, saves, _restart_seconds(attempts[1:], past))


def _restart_seconds(attempts: list[Attempt], events: list[dict]) -> float:
    """From each attempt's start to its resume, in attempts that saved after resuming (in one that
    did not, that time is already counted as work lost)."""
    times = (event_time(e.get("time")) for e in events if e.get("kind") == "resumed_from")
    resumes = sorted(t for t in times if t is not None)
    total = 0.0
    for attempt in attempts:
        assert attempt.start is not None
        resumed = next((t for t in resumes if t >= attempt.start), None)
        first_save = min(attempt.checkpoints, default=None)
        if resumed is not None and first_save is not None and resumed <= first_save:
            total += (resumed - attempt.start).total_seconds()
    return total


def _save_seconds(event: dict) -> float:
    seconds = event.get("seconds")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return 0.0
    return float(seconds) if 0 <= seconds <= MAX_SAVE_SECONDS else 0.0


def pool_rate(published: Mapping[str, Any] | None, constraint: str) -> tuple[float, str] | None:
    """The live per-node-hour rate of the pools a job's constraint allows (``a&b`` or ``a,b``: pools
    with every feature named), weighted by their nodes, and their names; None when none is known.
    A constraint with ``|``, brackets or counts names no one pool set: no judgement."""
    if not published:
        return None
    wanted = set(re.split(r"[&,]", constraint)) if constraint else set()
    if not all(_NAME.fullmatch(name) for name in wanted):
        return None
    weighted, nodes, names = 0.0, 0, []
    for pool, figures in sorted(published.get("pools", {}).items()):
        try:
            features = set(figures["features"])
            count, rate = int(figures["nodes"]), float(figures["per_node_hour"])
        except (KeyError, TypeError, ValueError):
            continue  # one bad pool never hides the others
        if wanted <= features and 0 < count < 10**7 and 0 <= rate < 1e6:
            weighted, nodes = weighted + rate * count, nodes + count
            names.append(pool or "(no feature)")
    return (weighted / nodes, ", ".join(names)) if nodes else None


def price_ratio(prices: Prices, gpus: bool) -> tuple[float, str]:
    """Preemptible over on-demand for the job's unit (GPU- or CPU-hours), from the ``[report]`` prices,
    else the discount (configured or the documented default): the ratio and how it was found."""
    preemptible, on_demand = prices.for_unit("GPU-hours" if gpus else "CPU-hours")
    if preemptible is not None and on_demand:
        return preemptible / on_demand, f"{'GPU' if gpus else 'CPU'}-hour prices"
    return 1.0 - prices.discount, f"assumed discount {prices.discount:.0%}"


Figure = tuple[float, str]  # a number and where it came from, for the line that says why


def dearer(
    overhead: Overhead | None, rate: Figure | None, nodes: int, price: Figure, margin: int
) -> str | None:
    """Why the job must move to on-demand nodes now (a line for ``history``), or None."""
    if overhead is None or rate is None:
        return None
    per_second = rate[0] * max(1, nodes) / 3600.0
    ratio = cost_ratio(price[0], per_second, overhead.per_preemption)
    if ratio <= 1.0 + margin / 100.0:
        return None
    cost = "a run never completes" if math.isinf(ratio) else f"a completed run costs {ratio:.2f}x on-demand"
    return (
        f"on preemptible nodes {cost}: {rate[0]:.3g} preemptions per node-hour "
        f"({rate[1]}) x {max(1, nodes)} node(s), {overhead.text()}, preemptible at {price[0]:.0%} of "
        f"on-demand ({price[1]}) (fallback-cost={margin}%)"
    )


@dataclass(frozen=True)
class CostWish:
    """What the judgement needs of the pending job besides its ledger."""

    job_id: str
    preemptions: int  # Slurm's restart count
    constraint: str  # its features now (before any move)
    nodes: int
    margin: int  # percent (fallback-cost=PERCENT)


def judge(
    wish: CostWish, events: Iterable[dict], published: Mapping[str, Any] | None, prices: Prices, now: datetime
) -> str | None:
    """``dearer`` from a job's ledger events, the published rate and the prices."""
    found = list(events)
    overhead = overhead_of(wish.job_id, found, wish.preemptions, now)
    if overhead is None:
        return None
    gpus = any(str(e.get("gpus", "")).strip() for e in found if e.get("kind") == "attempt_start")
    rate = pool_rate(published, wish.constraint)
    return dearer(overhead, rate, wish.nodes, price_ratio(prices, gpus), wish.margin)
