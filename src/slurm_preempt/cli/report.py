"""``slurm-preempt history`` and ``slurm-preempt report``: what preemption did to jobs and what it cost."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.errors import UsageError
from slurm_preempt.records import history as histories
from slurm_preempt.records import report as reports
from slurm_preempt.records import texts

state_dir_option = click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help=(
        "Ledger folder [default: $SLURM_PREEMPT_STATE_DIR, config state_dir, /var/lib/slurm-preempt if "
        "it exists, else ~/.local/state/slurm-preempt]."
    ),
)
no_sacct_option = click.option("--no-sacct", is_flag=True, help="Use the ledger alone, even if sacct works.")


@click.command()
@click.argument("job_id")
@state_dir_option
@no_sacct_option
@click.option(
    "--timeline",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also draw the attempts into this .svg or .html file.",
)
@json_option
def history(job_id, state_dir, no_sacct, timeline, as_json):
    """Every attempt of one job: nodes, start, end, why it ended, notice, lost work, waits.

    \b
    Example:
      slurm-preempt history 12345
      slurm-preempt history 12345 --timeline job12345.svg --json
    """
    if not job_id.replace("_", "").isdigit():
        raise UsageError(f"{job_id!r} is not a Slurm job id")
    found = histories.run_history(job_id, state_dir, use_sacct=not no_sacct)
    if timeline is not None:
        from slurm_preempt.records import timeline as pictures

        pictures.write(found, timeline)
    if as_json:
        echo_json(found.to_json())
    else:
        click.echo(texts.history_text(found))
        if timeline is not None:
            click.echo(f"timeline written to {timeline}")


@click.command()
@state_dir_option
@no_sacct_option
@click.option("--since", help="Only jobs first started at or after this time (2026-12-01, 2026-12-01T06:00).")
@click.option("--user", help="Only this user's jobs.")
@click.option("--partition", help="Only jobs of this partition.")
@json_option
def report(state_dir, no_sacct, since, user, partition, as_json):
    """What preemption cost, per job and in total, against running the same work on-demand.

    \b
    Example:
      slurm-preempt report --since 2026-12-01 --user alice
      slurm-preempt report --partition gpu --json
    """
    result = reports.run_report(state_dir, not no_sacct, since, user, partition)
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(texts.report_text(result))
