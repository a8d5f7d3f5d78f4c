"""``slurm-preempt simulate``: cost and completion time of one job under each strategy, before running it."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.errors import UsageError
from slurm_preempt.simulate import results, spec, svg, trace


class _DEFAULT:
    """The defaults as the options show them, from their one declaration in ``simulate.spec``."""

    notice_seconds = f"{spec.JobSpec.notice_seconds:g}"
    discount = f"{spec.Prices.discount:g}"
    unannounced = f"{spec.Field.unannounced:g}"
    mass_drain_fraction = f"{spec.Field.mass_drain_fraction:g}"
    fallback_after = f"{spec.Policy.fallback_after:g}"
    fallback_pending_minutes = f"{spec.Policy.fallback_pending_minutes:g}"
    deadline_margin = f"{spec.Policy.deadline_margin:g}"
    shrink_restart_seconds = f"{spec.JobSpec.shrink_restart_seconds:g}"
    refill_minutes = "-".join(dict.fromkeys(f"{m:g}" for m in spec.REFILL_MINUTES))


def _option(name: str, help_text: str, default: str | None = None):
    return click.option(name, default=default, show_default=default is not None, help=help_text)


@click.command()
@_option("--work-hours", "Hours of work of the job on its full node count, uninterrupted.")
@_option("--nodes", "Nodes the job runs on.", "1")
@_option("--checkpoint-seconds", "Seconds one checkpoint takes.")
@_option("--restart-seconds", "Seconds from running again to computing again: N or LOW-HIGH.", "0")
@_option(
    "--notice-seconds", "Seconds from drain to removal (the provider's notice).", _DEFAULT.notice_seconds
)
@_option(
    "--min-nodes",
    "Shrink in place down to N nodes at a told preemption of a node other than the batch host "
    "(elastic --nodes=MIN-MAX job; linear scaling). Default: the job's --nodes, no shrink.",
)
@_option(
    "--shrink-restart-seconds",
    "Seconds from the final checkpoint to computing again on the survivors (measured).",
    _DEFAULT.shrink_restart_seconds,
)
@click.option(
    "--grow-back",
    is_flag=True,
    help="Also model grow-back: a shrunk job requeues at full width once a removed node's capacity "
    "is back (one final checkpoint and one restart; needs --min-nodes).",
)
@_option(
    "--refill-minutes",
    "Minutes from a node's removal until the provider's capacity is back: N or LOW-HIGH.",
    _DEFAULT.refill_minutes,
)
@_option("--mtbp", "Mean hours between preemptions of one node.")
@click.option("--trace", type=click.Path(path_type=Path), help="Preemption times, one per line: TIME [NODE].")
@_option("--deadline-hours", "Hours from submission by which the job must be done.")
@_option("--discount", "Preemptible price = on-demand x (1 - discount), without prices.", _DEFAULT.discount)
@_option("--price-on-demand", "Price of an on-demand node-hour.")
@_option("--price-preemptible", "Price of a preemptible node-hour.")
@_option("--unannounced", "Share of preemptions that come with no usable notice.", _DEFAULT.unannounced)
@_option("--rate-jump", "HOUR:FACTOR: from that hour on the rate is multiplied by FACTOR.")
@_option("--mass-drain-hours", "Mean hours between correlated mass drains of the pool.")
@_option("--mass-drain-fraction", "Share of the pool a mass drain takes.", _DEFAULT.mass_drain_fraction)
@_option("--capacity-wait-minutes", "Minutes no preemptible node is free after a mass drain.", "0")
@_option("--fallback-after", "The fallback-after policy's K preemptions.", _DEFAULT.fallback_after)
@_option(
    "--fallback-pending-minutes", "The fallback-pending policy's minutes.", _DEFAULT.fallback_pending_minutes
)
@_option(
    "--deadline-margin",
    "Reserve the deadline policy keeps, as a share of the work left.",
    _DEFAULT.deadline_margin,
)
@_option("--runs", "Simulated runs per strategy.", "10000")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed: the same seed, the same figures.")
@click.option(
    "--svg",
    "svg_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also draw cost against preemption rate into this SVG file.",
)
@json_option
def command(svg_path, seed, as_json, grow_back, **given):
    """Expected cost per completed run, completion time and deadline misses of one job, per strategy.

    On-demand only, the seeds' plain recipe, submitit-style and slurm-preempt with each fallback
    policy, over seeded simulated runs; the toolkit's figures are the measured ones.

    \b
    Example:
      slurm-preempt simulate --work-hours 100 --nodes 4 --mtbp 2 --checkpoint-seconds 60 \\
          --restart-seconds 180-300 --deadline-hours 130
      slurm-preempt simulate --work-hours 100 --nodes 4 --mtbp 2 --checkpoint-seconds 60 \\
          --restart-seconds 180-300 --min-nodes 2 --grow-back --refill-minutes 30
      slurm-preempt simulate --work-hours 10 --trace preemptions.txt --checkpoint-seconds 30 --json
    """
    job = _job(given, grow_back)
    runs = spec.check_runs(given["runs"])
    summaries = results.run_all(job, runs, seed)
    if svg_path is not None:
        svg.write(job, max(runs // 20, 200), seed, svg_path)
    if as_json:
        echo_json(results.to_json(job, summaries, runs, seed))
    else:
        click.echo(results.table(job, summaries, runs, seed))
        if svg_path is not None:
            click.echo(f"cost against preemption rate drawn in {svg_path}")


def _job(given: dict, grow_back: bool) -> spec.JobSpec:
    for required in ("work_hours", "checkpoint_seconds"):
        if given[required] is None:
            raise UsageError(f"--{required.replace('_', '-')} is required")
    figure = _figures(given)
    nodes = _whole("--nodes", figure("nodes"), spec.MAX_NODES)
    min_nodes = figure("min_nodes")
    return spec.JobSpec(
        work_hours=figure("work_hours"),
        nodes=nodes,
        min_nodes=None if min_nodes is None else _whole("--min-nodes", min_nodes, spec.MAX_NODES),
        checkpoint_seconds=figure("checkpoint_seconds"),
        restart_seconds=spec.restart_range(given["restart_seconds"]),
        notice_seconds=figure("notice_seconds"),
        shrink_restart_seconds=figure("shrink_restart_seconds"),
        grow_back=grow_back,
        refill_minutes=spec.value_range(
            "--refill-minutes", given["refill_minutes"], spec.MAX_HOURS * 60, "10-60"
        ),
        deadline_hours=figure("deadline_hours"),
        field=_field(given, figure),
        prices=spec.Prices(
            on_demand=figure("price_on_demand"),
            preemptible=figure("price_preemptible"),
            discount=figure("discount"),
        ),
        policy=spec.Policy(
            fallback_after=_whole("--fallback-after", figure("fallback_after"), 10_000),
            fallback_pending_minutes=figure("fallback_pending_minutes"),
            deadline_margin=figure("deadline_margin"),
        ),
    )


def _whole(option: str, value: float | None, high: float) -> int:
    number = spec.number(option, value, 0, high)
    if number != int(number):
        raise UsageError(f"{option} {value:g}: must be a whole number")
    return int(number)


def _figures(given: dict):
    def figure(key: str) -> float | None:
        text = given[key]
        if text is None:
            return None
        try:
            return float(text)
        except ValueError:
            raise UsageError(f"--{key.replace('_', '-')} {text!r}: not a number") from None

    return figure


def _field(given: dict, figure) -> spec.Field:
    jump_hour, jump_factor = None, 1.0
    if given["rate_jump"] is not None:
        hour, _, factor = given["rate_jump"].partition(":")
        if not factor:
            raise UsageError(f"--rate-jump {given['rate_jump']!r}: give HOUR:FACTOR (20:4)")
        jump_hour = spec.number("--rate-jump (hour)", hour, 0, spec.MAX_HOURS, low_open=False)
        jump_factor = spec.number("--rate-jump (factor)", factor, 0, 1000)
    return spec.Field(
        mtbp_hours=figure("mtbp"),
        trace_gaps=trace.read_gaps(given["trace"]) if given["trace"] is not None else (),
        jump_hour=jump_hour,
        jump_factor=jump_factor,
        mass_drain_hours=figure("mass_drain_hours"),
        mass_drain_fraction=figure("mass_drain_fraction"),
        capacity_wait_minutes=figure("capacity_wait_minutes"),
        unannounced=figure("unannounced"),
    )
