"""``slurm-preempt hooks``: install and check the prolog/epilog hooks (admins)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from slurm_preempt.admin import hooks as lib
from slurm_preempt.admin import requeuecheck
from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.config import DEFAULT_STATE_DIR
from slurm_preempt.slurm.commands import Slurm

prefix_option = click.option(
    "--prefix",
    type=click.Path(path_type=Path),
    default=lib.DEFAULT_PREFIX,
    show_default=True,
    help="Folder that holds prolog.d/, epilog.d/ and slurm-preempt/.",
)


@click.group()
def group():
    """Install and check the prolog/epilog hooks that record every attempt of every job.

    \b
    Example:
      slurm-preempt hooks install --prefix /etc/slurm --state-dir /shared/slurm-preempt
      slurm-preempt hooks check --prefix /etc/slurm
    """


@group.command()
@prefix_option
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Shared folder for the ledger and notices (root-owned, mode 755).",
)
@click.option("--log", "log_file", default="", help="Also log hook problems to this file (syslog always).")
@click.option(
    "--slurm-user",
    default="root",
    show_default=True,
    help="slurm.conf's SlurmUser (EpilogSlurmctld runs as it; Debian's packages use `slurm`).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@click.option(
    "--edit-conf",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also put the lines into this slurm.conf (a backup is kept). Never done unless asked.",
)
@json_option
def install(prefix, state_dir, log_file, slurm_user, dry_run, edit_conf, as_json):
    """Copy the hooks under --prefix and print the slurm.conf lines they need.

    \b
    Example:
      slurm-preempt hooks install --dry-run
      slurm-preempt hooks install --prefix /etc/slurm --state-dir /shared/sp-state
    """
    result = lib.install(
        prefix, state_dir, dry_run=dry_run, edit_conf=edit_conf, log=log_file, slurm_user=slurm_user
    )
    if as_json:
        echo_json(result.to_json())
        return
    for action in result.actions:
        click.echo(("would " if dry_run else "") + action)
    if result.conf_edited:
        click.echo(f"edited {edit_conf} (backup {result.conf_edited}); restart slurmctld and slurmd")
    else:
        click.echo("\nAdd these lines to slurm.conf on every node and the controller, then restart Slurm:")
    for line in result.conf_lines:
        click.echo(f"  {line}")


@group.command()
@prefix_option
@click.option(
    "--conf",
    type=click.Path(path_type=Path, dir_okay=False),
    help="slurm.conf to check [default: $SLURM_CONF or /etc/slurm/slurm.conf].",
)
@click.option("--no-dry-run", is_flag=True, help="Do not run the hooks with a fake job.")
@click.option("--no-slurm", is_flag=True, help="Do not ask slurmctld for its requeue settings.")
@json_option
def check(prefix, conf, no_dry_run, no_slurm, as_json):
    """Verify an installation; exit 1 and say what is wrong when anything is. Notes say what the running
    Slurm does to requeued jobs (the hold after a requeue, requeue_delay on 25.11+, MaxBatchRequeue).

    \b
    Example:
      slurm-preempt hooks check --prefix /etc/slurm --conf /etc/slurm/slurm.conf
    """
    findings = lib.check(prefix, conf, dry_run=not no_dry_run)
    if not no_slurm:
        env = {**os.environ, "SLURM_CONF": str(conf)} if conf else None
        findings += requeuecheck.check(Slurm(timeout=10, env=env))
    bad = [f for f in findings if not f.ok]
    if as_json:
        echo_json({"ok": not bad, "findings": [f.to_json() for f in findings]})
    else:
        for finding in findings:
            label = "note" if finding.note else "ok  " if finding.ok else "FAIL"
            click.echo(f"{label} {finding.message}")
        click.echo(f"\n{len(bad)} problem(s) found" if bad else "\nthe hooks are installed correctly")
    if bad:
        raise SystemExit(1)
