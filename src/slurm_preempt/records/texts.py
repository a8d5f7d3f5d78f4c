"""How a job's history and the report read for people (``slurm-preempt history`` and ``report``
without ``--json``): plain lines, times in UTC. What they say is built in ``records/history.py`` and
``records/report.py``; this module only lays it out."""

from __future__ import annotations

from slurm_preempt.records import shrinks
from slurm_preempt.records.attempts import JobHistory, clock_text, seconds_text
from slurm_preempt.records.leadtime import lead_lines
from slurm_preempt.records.report import Report


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def history_text(history: JobHistory) -> str:
    """Human lines: one block per attempt (times in UTC)."""
    source = "ledger + sacct -D" if history.accounting else "ledger only (no accounting)"
    head = f"job {history.job_id}"
    if history.user:
        head += f"  user {history.user}"
    if history.partition:
        head += f"  partition {history.partition}"
    if history.constraints:
        head += f"  constraint {history.constraints}"
    preemptions = sum(1 for a in history.attempts if a.preempted)
    lines = [
        head,
        f"{len(history.attempts)} attempt(s), {preemptions} preemption(s), "
        f"{seconds_text(history.lost_seconds)} of work lost; from {source}; times UTC",
        "",
    ]
    for a in history.attempts:
        lines.append(
            f"attempt {a.number}  {','.join(a.nodes) or '?'}  {clock_text(a.start)} -> {clock_text(a.end)}"
            f"  ran {_span(a.run_seconds)}"
        )
        lines.append(f"  ended: {a.cause}" + (f" (exit {a.exit_code})" if a.exit_code else ""))
        if a.notice_time or a.deadline:
            by = f"  (from the {_WRITERS[a.notice_by]})" if a.notice_by in ("writer", "owner") else ""
            lines.append(f"  notice {clock_text(a.notice_time)}  deadline {clock_text(a.deadline)}{by}")
        lines.append(
            f"  checkpoints {len(a.checkpoints)}, last {clock_text(a.last_checkpoint)}"
            f"  work lost {seconds_text(a.lost_seconds)}"
        )
        if a.intervals:
            lines.append("  checkpoint interval " + " -> ".join(f"{s:.0f} s" for s in a.intervals))
        lines += [f"  {shrinks.text(shrink, clock_text)}" for shrink in a.shrinks]
        if a.wait_before is not None:
            lines.append(f"  waited {_span(a.wait_before)} before it started")
    lines += [f"moved: {move}" for move in history.moves]
    for warning in history.warnings:
        lines.append(f"warning: {warning}")
    written = [f"{_WRITERS[w]} {n}" for w, n in sorted(history.events_by.items()) if w in _WRITERS]
    if written:
        lines.append("events written by: " + ", ".join(written))
    if history.ignored_events:
        lines.append(f"\n{history.ignored_events} event(s) ignored: not written by root or the job's owner")
    return "\n".join(lines)


# Who wrote an event (ledger.written_by), as history says it: a notice of the job's own sidecar is
# the job's owner's word, not the cluster watcher's.
_WRITERS = {"root": "root", "writer": "SlurmUser", "owner": "job's owner"}


def _hours(value: float) -> str:
    return f"{value:.3f}"


def _cost(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value >= 1 else f"{value:.4f}"


def _cost_cells(money: tuple, node_hours: float, lost_node_hours: float, discount, fraction) -> tuple:
    """preemptible, on-demand and their ratio: money, or node-hours marked * (assumed discount)."""
    ratio = "-" if fraction is None else f"{fraction:.0%}"
    if discount is None:
        return _cost(money[0]), _cost(money[1]), ratio
    pre, on_demand = node_hours * (1 - discount), node_hours - lost_node_hours
    return f"{_hours(pre)}*", f"{_hours(on_demand)}*", f"{ratio}*"


def _assumption_note(discount: float) -> str:
    return (
        f"* assumed, no price configured: node-hours, preemptible at {1 - discount:.0%} of the on-demand "
        "price (preemptible_discount,\n  0.5 by default); set [report] gpu_hour_on_demand or "
        "cpu_hour_on_demand to compare money (docs/report.md)"
    )


def report_text(report: Report) -> str:
    from slurm_preempt.watch.rate import describe

    return "\n\n".join(part for part in (_jobs_text(report), "\n".join(describe(report.live_rate))) if part)


def _jobs_text(report: Report) -> str:
    source = "ledger + sacct -D" if report.accounting else "ledger only (no accounting)"
    if not report.jobs:
        return f"no jobs recorded ({source})"
    unit = report.jobs[0].unit if len({j.unit for j in report.jobs}) == 1 else "resource-hours"
    head = (
        f"{'job':>10} {'user':<10} {'att':>3} {'pre':>3} {'run ' + unit:>16} {'lost':>8} {'waited':>8} "
        f"{'goodput':>7} {'preemptible':>11} {'on-demand':>9} {'ratio':>6}"
    )
    lines = [f"{len(report.jobs)} job(s), from {source}", "", head]
    for j in report.jobs:
        money = (j.cost_preemptible, j.cost_on_demand)
        cells = _cost_cells(money, j.node_hours, j.lost_node_hours, j.assumed_discount, j.cost_fraction)
        lines.append(
            f"{j.job_id:>10} {j.user[:10]:<10} {j.attempts:>3} {j.preemptions:>3} "
            f"{_hours(j.run_hours):>16} {_hours(j.lost_hours):>8} {j.waited_seconds:>7.0f}s "
            f"{100 * j.goodput:>6.0f}% {cells[0]:>11} {cells[1]:>9} {cells[2]:>6}"
        )
    t = report.totals()
    money = (t["cost_preemptible"], t["cost_on_demand"])
    cells = _cost_cells(
        money, t["node_hours"], t["lost_node_hours"], t["assumed_discount"], t["cost_fraction"]
    )
    lines.append(
        f"{'total':>10} {'':<10} {t['attempts']:>3} {t['preemptions']:>3} {_hours(t['run_hours']):>16} "
        f"{_hours(t['lost_hours']):>8} {t['waited_seconds']:>7.0f}s {100 * t['goodput']:>6.0f}% "
        f"{cells[0]:>11} {cells[1]:>9} {cells[2]:>6}"
    )
    if t["assumed_discount"] is not None:
        lines.append(_assumption_note(t["assumed_discount"]))
    lines.append("")
    for j in report.jobs:
        lines.append(f"job {j.job_id}: {j.verdict}")
        if j.events_by.get("owner"):  # the job's owner's say-so counts in its figures: say so
            lines.append(f"  {j.events_by['owner']} of its events written by the job's owner, not root")
        if j.shrinks:
            lines.append(f"  shrank in place {j.shrinks} time(s), no requeue: idle {j.shrink_seconds:.1f}s")
        advice = j.interval_advice
        if advice:
            lines.append(
                f"  checkpoint every ~{advice['advised_seconds']:.0f}s ({advice['formula']}: "
                f"checkpoint {advice['checkpoint_seconds']}s, mean time between preemptions "
                f"{advice['mtbp_seconds']:.0f}s)"
            )
    lead = lead_lines(report.leads)
    if lead:
        lines += ["", *lead]
    if report.unreadable:
        lines.append(f"\n{len(report.unreadable)} job(s) skipped, their ledger unreadable: " + ", ".join(
            f"{job_id} ({why})" for job_id, why in sorted(report.unreadable.items())[:10]))  # fmt: skip
    if t["mtbp_seconds"]:
        lines.append(
            f"\nmean time between preemptions {t['mtbp_seconds']:.0f}s over all jobs"
            + (f", one checkpoint {t['checkpoint_seconds']}s" if t["checkpoint_seconds"] else "")
            + ": use them with `slurm-preempt sbatch --checkpoint-interval auto`"
        )
    return "\n".join(lines)
