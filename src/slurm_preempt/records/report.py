"""What preemption cost: per job and in total, against running the same work on-demand.

The honest comparison is the total cost of a completed run, not the price per GPU-hour: on
preemptible nodes a job pays for every attempt (work later lost and restart overhead included) at
the cheaper price; on-demand it would have paid once for the useful work at the full price.

Prices, and the assumption used without them, are in ``records.prices``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_preempt import ledger
from slurm_preempt.errors import UsageError
from slurm_preempt.job.interval import checkpoint_interval, young_daly
from slurm_preempt.records import history as hist
from slurm_preempt.records.attempts import FINISHED_CAUSES, Attempt, JobHistory
from slurm_preempt.records.leadtime import Lead, SourceLead, by_source, leads_of
from slurm_preempt.records.prices import Prices, assumed_fraction, assumption


@dataclass
class JobCost:
    job_id: str
    user: str
    partition: str
    attempts: int
    preemptions: int
    unit: str  # GPU-hours or CPU-hours
    run_hours: float  # resource-hours paid for, every attempt
    lost_hours: float
    waited_seconds: float
    completed: bool
    wall_run_seconds: float = 0.0  # attempts' run time, not weighted by CPUs/GPUs (for the MTBP)
    checkpoint_seconds: float | None = None  # mean measured cost of one checkpoint
    last_cause: str = ""
    cost_preemptible: float | None = None
    cost_on_demand: float | None = None
    interval_advice: dict | None = None
    verdict: str = ""
    node_hours: float = 0.0  # every attempt, as for run_hours, but per node
    lost_node_hours: float = 0.0
    assumed_discount: float | None = None  # no price for this job's unit: compared in node-hours
    events_by: dict[str, int] = field(default_factory=dict)  # its believed events by writer (history)
    shrinks: int = 0  # nodes given back inside an attempt (job/shrink.py): no requeue
    shrink_seconds: float = 0.0  # idle time they cost: final checkpoint -> running again

    @property
    def useful_hours(self) -> float:
        return max(0.0, self.run_hours - self.lost_hours)

    @property
    def cost_fraction(self) -> float | None:
        """The preemptible cost over the on-demand cost of the same work, from prices or assumed."""
        if self.assumed_discount is None:
            if self.cost_preemptible is None or not self.cost_on_demand:
                return None
            return self.cost_preemptible / self.cost_on_demand
        return assumed_fraction(self.node_hours, self.lost_node_hours, self.assumed_discount)

    @property
    def goodput(self) -> float:
        return self.useful_hours / self.run_hours if self.run_hours else 1.0

    def to_json(self) -> dict:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "partition": self.partition,
            "attempts": self.attempts,
            "preemptions": self.preemptions,
            "completed": self.completed,
            "unit": self.unit,
            "run_hours": round(self.run_hours, 4),
            "lost_hours": round(self.lost_hours, 4),
            "useful_hours": round(self.useful_hours, 4),
            "waited_seconds": round(self.waited_seconds, 1),
            "goodput": round(self.goodput, 3),
            "cost_preemptible": _money(self.cost_preemptible),
            "cost_on_demand": _money(self.cost_on_demand),
            "node_hours": round(self.node_hours, 4),
            "lost_node_hours": round(self.lost_node_hours, 4),
            "cost_fraction": _money(self.cost_fraction),
            "assumed_discount": self.assumed_discount,
            "interval_advice": self.interval_advice,
            "verdict": self.verdict,
            "events_by": self.events_by,
            "shrinks": self.shrinks,
            "shrink_seconds": round(self.shrink_seconds, 1),
        }


def _money(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def job_cost(history: JobHistory, prices: Prices) -> JobCost:
    ended = [a for a in history.attempts if a.end is not None]
    gpu = any(a.gpus for a in history.attempts)
    unit = "GPU-hours" if gpu else "CPU-hours"

    def width(a: Attempt) -> int:
        return (a.gpus if gpu else a.cpus) or 1

    def nodes(a: Attempt) -> int:
        return len(a.nodes) or 1

    run = sum(a.run_seconds * width(a) for a in ended) / 3600
    lost = sum(a.lost_seconds * width(a) for a in ended) / 3600
    cost = JobCost(
        job_id=history.job_id,
        user=history.user,
        partition=history.partition,
        attempts=len(history.attempts),
        preemptions=sum(1 for a in history.attempts if a.preempted),
        unit=unit,
        run_hours=run,
        lost_hours=lost,
        waited_seconds=sum(a.wait_before or 0.0 for a in history.attempts),
        completed=bool(history.attempts) and history.attempts[-1].cause in FINISHED_CAUSES,
        wall_run_seconds=sum(a.run_seconds for a in ended),
        checkpoint_seconds=_mean(history.checkpoint_seconds),
        last_cause=history.attempts[-1].cause if history.attempts else "",
        node_hours=sum(a.run_seconds * nodes(a) for a in ended) / 3600,
        lost_node_hours=sum(a.lost_seconds * nodes(a) for a in ended) / 3600,
        events_by=dict(history.events_by),
        shrinks=sum(len(a.shrinks) for a in history.attempts),
        shrink_seconds=history.shrink_seconds,
    )
    pre, on_demand = prices.for_unit(unit)
    if pre is not None and on_demand is not None:
        cost.cost_preemptible = cost.run_hours * pre
        cost.cost_on_demand = cost.useful_hours * on_demand
    else:
        cost.assumed_discount = prices.discount
    cost.interval_advice = advise_interval(
        cost.checkpoint_seconds, mtbp(cost.wall_run_seconds, cost.preemptions), _mean_interval(history)
    )
    cost.verdict = verdict(cost)
    return cost


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mtbp(run_seconds: float, preemptions: int) -> float | None:
    """Observed mean time between preemptions: the ended attempts' run time (wall clock, not weighted
    by CPUs/GPUs) over the preemptions among them; None before the first one. The one definition, for
    a job and for the report's totals."""
    return run_seconds / preemptions if preemptions else None


def _mean_interval(history: JobHistory) -> float | None:
    gaps = []
    for attempt in history.attempts:
        marks = attempt.checkpoints
        gaps += [(b - a).total_seconds() for a, b in zip(marks, marks[1:], strict=False)]
    return _mean(gaps)


def advise_interval(
    checkpoint_seconds: float | None, mtbp_seconds: float | None, current_seconds: float | None = None
) -> dict | None:
    """Young/Daly checkpoint interval from the measured cost of a checkpoint and the observed mean
    time between preemptions. None when either is unknown. Used by ``sbatch --checkpoint-interval auto``.
    """
    if not checkpoint_seconds or not mtbp_seconds or checkpoint_seconds <= 0 or mtbp_seconds <= 0:
        return None
    return {
        "checkpoint_seconds": round(checkpoint_seconds, 2),
        "mtbp_seconds": round(mtbp_seconds, 1),
        "young_seconds": round(young_daly(checkpoint_seconds, mtbp_seconds), 1),
        # Every preemption taken as unannounced: the advice holds without a watcher too.
        "advised_seconds": round(checkpoint_interval(checkpoint_seconds, mtbp_seconds), 1),
        "formula": "daly",  # the rule lives once, in job/interval.py
        "current_seconds": None if current_seconds is None else round(current_seconds, 1),
    }


def verdict(cost: JobCost) -> str:
    """One plain sentence on whether preemptible nodes paid off for this job."""
    if cost.attempts == 0:
        return "no attempt recorded"
    if not cost.completed:
        return "still running" if cost.last_cause == "running" else f"did not complete: {cost.last_cause}"
    fraction = cost.cost_fraction
    label = assumption(cost.assumed_discount)
    if fraction is not None and fraction >= 1:
        if cost.assumed_discount is None:
            spent = (
                f"{cost.cost_preemptible:.2f} against {cost.cost_on_demand:.2f} on-demand ({fraction:.0%})"
            )
        else:
            spent = f"{fraction:.0%} of the on-demand cost{label}"
        return f"preemptible is NOT worth it for this job: lost work and restarts cost {spent}"
    if cost.goodput < 0.5:
        return (
            f"preemptible is NOT worth it for this job: {100 * (1 - cost.goodput):.0f}% of the run was lost"
        )
    share = "" if fraction is None else f", {fraction:.0%} of the on-demand cost{label}"
    if cost.preemptions == 0:
        return f"never preempted: preemptible was pure saving{share}"
    return f"worth it: {cost.preemptions} preemption(s), {100 * cost.goodput:.0f}% goodput{share}"


@dataclass
class Report:
    jobs: list[JobCost] = field(default_factory=list)
    accounting: bool = False
    unreadable: dict[str, str] = field(default_factory=dict)  # job id -> why its ledger was skipped
    live_rate: dict | None = None  # what the watcher publishes (watch/rate.py)
    leads: list[SourceLead] = field(default_factory=list)  # lead time per notice source

    def totals(self) -> dict:
        def total(name):
            values = [getattr(j, name) for j in self.jobs]
            return None if any(v is None for v in values) else sum(values)

        run = sum(j.run_hours for j in self.jobs)
        lost = sum(j.lost_hours for j in self.jobs)
        preemptions = sum(j.preemptions for j in self.jobs)
        between = mtbp(sum(j.wall_run_seconds for j in self.jobs), preemptions)
        costs = [j.checkpoint_seconds for j in self.jobs if j.checkpoint_seconds]
        node_hours = sum(j.node_hours for j in self.jobs)
        lost_node_hours = sum(j.lost_node_hours for j in self.jobs)
        pre, on_demand = total("cost_preemptible"), total("cost_on_demand")
        # One job without a price puts the whole total on the assumption, so that it adds like to like.
        assumed = next((j.assumed_discount for j in self.jobs if j.assumed_discount is not None), None)
        if assumed is not None:
            fraction = assumed_fraction(node_hours, lost_node_hours, assumed)
        else:
            fraction = pre / on_demand if pre is not None and on_demand else None
        return {
            "jobs": len(self.jobs),
            "attempts": sum(j.attempts for j in self.jobs),
            "preemptions": sum(j.preemptions for j in self.jobs),
            "run_hours": round(run, 4),
            "lost_hours": round(lost, 4),
            "waited_seconds": round(sum(j.waited_seconds for j in self.jobs), 1),
            "goodput": round((run - lost) / run, 3) if run else 1.0,
            "cost_preemptible": _money(pre),
            "cost_on_demand": _money(on_demand),
            "node_hours": round(node_hours, 4),
            "lost_node_hours": round(lost_node_hours, 4),
            "cost_fraction": _money(fraction),
            "assumed_discount": assumed,
            # For `slurm-preempt sbatch --checkpoint-interval auto --mtbp ... --checkpoint-seconds ...`
            "mtbp_seconds": None if between is None else round(between, 1),
            "checkpoint_seconds": round(sum(costs) / len(costs), 3) if costs else None,
        }

    def to_json(self) -> dict:
        return {
            "accounting": self.accounting,
            "jobs": [j.to_json() for j in self.jobs],
            "total": self.totals(),
            "unreadable": self.unreadable,
            "live_rate": self.live_rate,
            "lead_times": [row.to_json() for row in self.leads],
        }


def build_report(
    state_dir: Path | str,
    prices: Prices,
    slurm=None,
    since: datetime | None = None,
    user: str | None = None,
    partition: str | None = None,
) -> Report:
    """Every job in the ledger (merged with sacct -D when ``slurm`` is given and accounting answers)."""
    report = Report()
    ids = ledger.job_ids(state_dir)
    rows = hist.accounting_rows(slurm, ids) if slurm is not None and ids else None
    report.accounting = rows is not None
    leads: list[Lead] = []
    for job_id in ids:
        try:
            history = hist.from_ledger(job_id, state_dir, None if rows is None else rows.get(job_id, []))
            if not history.attempts or not _wanted(history, since, user, partition):
                continue
            report.jobs.append(job_cost(history, prices))
            leads += leads_of([history])
        except (OSError, ValueError, TypeError, OverflowError, ArithmeticError, UsageError) as exc:
            # One job's ledger (its folder is its user's) never stops the report of everyone else.
            report.unreadable[job_id] = f"{type(exc).__name__}: {exc}"[:200]
    report.leads = by_source(leads)
    return report


def _wanted(history: JobHistory, since, user, partition) -> bool:
    first = history.attempts[0].start
    if since is not None and (first is None or first < since):
        return False
    if user and history.user != user:
        return False
    return not (partition and history.partition != partition)


def run_report(
    state_dir: Path | str | None = None,
    use_sacct: bool = True,
    since: str | None = None,
    user: str | None = None,
    partition: str | None = None,
) -> Report:
    """What ``slurm-preempt report`` shows: folder and prices from the config."""
    from slurm_preempt import config
    from slurm_preempt.errors import UsageError
    from slurm_preempt.notice import from_text
    from slurm_preempt.slurm.commands import Slurm

    settings = config.load()
    folder = Path(state_dir) if state_dir else settings.state_dir()
    moment = None
    if since:
        try:
            moment = from_text(since if "T" in since else since + "T00:00:00")
        except ValueError:
            raise UsageError(f"--since {since!r} is not a date (2026-12-01 or 2026-12-01T06:00)") from None
    prices = Prices.from_config(settings.section("report"))
    from slurm_preempt.watch import rate

    found = build_report(folder, prices, Slurm() if use_sacct else None, moment, user, partition)
    found.live_rate = rate.read_published(folder)
    return found
