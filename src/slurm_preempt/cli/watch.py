"""``slurm-preempt watch``: the drain watcher (cluster daemon, per-job sidecar, or one poll)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import click

from slurm_preempt.watch import settings as watchconfig
from slurm_preempt.watch.watcher import run


def _log(line: str) -> None:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    click.echo(f"{stamp} slurm-preempt watch: {line}", err=True)


def _emit_json(event: dict) -> None:
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


@click.command()
@click.option("--cluster", "mode", flag_value="cluster", help="Watch every node (daemon, admins).")
@click.option("--sidecar", "mode", flag_value="sidecar", help="Watch only the nodes of --job (users).")
@click.option("--job", "job_id", metavar="JOBID", help="The job a sidecar watches ($SLURM_JOB_ID).")
@click.option("--once", is_flag=True, help="Poll once and exit (cron, tests).")
@click.option("--interval", type=float, help="Seconds between polls [config: 5].")
@click.option("--grace", type=float, help="Seconds from drain to removal: the notice deadline [config: 300].")
@click.option(
    "--enforce/--no-enforce", default=None, help="Requeue opted-in jobs still running near the deadline."
)
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="Config file (TOML, [watch]).")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), help="Folder of notices, ledger, watcher state."
)
@click.option("--allow-preemptible-host", is_flag=True, help="Run --cluster even on a preemptible node.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout.")
def command(
    mode, job_id, once, interval, grace, enforce, config_file, state_dir, allow_preemptible_host, as_json
):
    """Watch for draining preemptible nodes; tell their jobs (notice file + signal for jobs that opted
    in), restart requeued jobs at once, move often-preempted jobs to standard nodes.

    Log lines go to stderr; with --json each action is also a JSON line on stdout.

    \b
    Example:
      slurm-preempt watch --cluster --interval 2          # daemon on a standard node
      slurm-preempt watch --sidecar --job "$SLURM_JOB_ID" --grace 300 &   # in a job script
      slurm-preempt watch --cluster --once --json         # one poll, for cron
    """
    if mode is None:
        raise click.UsageError("choose --cluster (daemon) or --sidecar --job JOBID")
    if (mode == "sidecar") != bool(job_id):
        raise click.UsageError("--job goes with --sidecar, and --sidecar needs --job")
    overrides = {"interval": interval, "grace": grace, "enforce": enforce}
    if mode == "sidecar":
        overrides.update({"fast_restart": False, "fallback": False})  # the sidecar ends with its job
    watcher = watchconfig.build(
        overrides,
        job_id=job_id,
        config_file=config_file,
        state_dir=state_dir,
        allow_preemptible_host=allow_preemptible_host,
        log=_log,
        emit=_emit_json if as_json else (lambda _e: None),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    what = f"job {job_id}" if job_id else "the cluster"
    _log(f"watching {what} every {watcher.settings.interval:g} s, grace {watcher.settings.grace:g} s")
    run(watcher, stop=stop, once=once, on_poll=_emit_json if (as_json and once) else (lambda _r: None))
