"""``slurm-preempt watch``: the drain watcher (cluster daemon, a user's own watcher, per-job sidecar,
or one poll)."""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from slurm_preempt.cli import _logging
from slurm_preempt.watch import metrics as watchmetrics
from slurm_preempt.watch import settings as watchconfig
from slurm_preempt.watch.loop import run

log = logging.getLogger(__name__)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULTS = watchconfig.DEFAULTS


def _emit_json(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


@click.command()
@click.option("--cluster", "mode", flag_value="cluster", help="Watch every node (daemon, admins).")
@click.option(
    "--user", "mode", flag_value="user", help="Watch every node for your own jobs only (no admin rights)."
)
@click.option("--sidecar", "mode", flag_value="sidecar", help="Watch only the nodes of --job (users).")
@click.option("--job", "job_id", metavar="JOBID", help="The job a sidecar watches ($SLURM_JOB_ID).")
@click.option("--once", is_flag=True, help="Poll once and exit (cron, tests).")
@click.option("--interval", type=float, help=f"Seconds between polls [config: {DEFAULTS['interval']:g}].")
@click.option(
    "--grace",
    type=float,
    help=f"Seconds from drain to removal: the notice deadline [config: {DEFAULTS['grace']:g}].",
)
@click.option(
    "--enforce/--no-enforce", default=None, help="Requeue opted-in jobs still running near the deadline."
)
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="Config file (TOML, [watch]).")
@click.option(
    "--state-dir", type=click.Path(path_type=Path), help="Folder of notices, ledger, watcher state."
)
@click.option("--allow-preemptible-host", is_flag=True, help="Run --cluster even on a preemptible node.")
@click.option(
    "--metrics",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics there (PORT alone: on 127.0.0.1) [config: metrics, off].",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout.")
def command(
    mode: str | None,
    job_id: str | None,
    once: bool,
    interval: float | None,
    grace: float | None,
    enforce: bool | None,
    config_file: Path | None,
    state_dir: Path | None,
    allow_preemptible_host: bool,
    metrics: str | None,
    as_json: bool,
) -> None:
    """Watch for draining preemptible nodes; tell their jobs (notice file + signal for jobs that opted
    in), restart requeued jobs at once, move often-preempted jobs to standard nodes.

    --cluster is the admins' daemon (every job); --user is the same for your own jobs, run without
    admin rights (on a login node, as a systemd user service, or as a small job on a standard node):
    the path for users on clusters whose admins installed nothing. Two watchers of the same kind may
    share one state folder (two hosts): one acts, the other stands by and takes over if it dies.

    Log lines go to stderr, each with its UTC time (-v adds debug lines); with --json each action is
    also a JSON line on stdout.

    \b
    Example:
      slurm-preempt watch --cluster --interval 2          # daemon on a standard node
      slurm-preempt watch --user                          # your own jobs, no admin rights
      slurm-preempt watch --sidecar --job "$SLURM_JOB_ID" --grace 300 &   # in a job script
      slurm-preempt watch --cluster --once --json         # one poll, for cron
      slurm-preempt watch --cluster --metrics 127.0.0.1:9464   # with metrics for Prometheus
    """
    if mode is None:
        raise click.UsageError("choose --cluster (daemon), --user (your own jobs) or --sidecar --job JOBID")
    if (mode == "sidecar") != bool(job_id):
        raise click.UsageError("--job goes with --sidecar, and --sidecar needs --job")
    _logging.stamp_lines()  # a watcher's log is read later (journald, a file): every line says when
    overrides: dict[str, Any] = {"interval": interval, "grace": grace, "enforce": enforce, "metrics": metrics}
    if mode == "sidecar":
        overrides.update({"fast_restart": False, "fallback": False})  # the sidecar ends with its job
    watcher = watchconfig.build(
        overrides,
        job_id=job_id,
        # Who we are, not who $USER says: Slurm decides what this uid may do to which job.
        user=pwd.getpwuid(os.getuid()).pw_name if mode == "user" else None,
        config_file=config_file,
        state_dir=state_dir,
        allow_preemptible_host=allow_preemptible_host,
        emit=_emit_json if as_json else (lambda _e: None),
    )
    served = watchmetrics.start(watcher)
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in _STOP_SIGNALS}
    what = {"cluster": "the cluster", "user": f"the jobs of {watcher.user}"}.get(mode, f"job {job_id}")
    log.info("watching %s every %g s, grace %g s", what, watcher.settings.interval, watcher.settings.grace)
    try:
        run(
            watcher,
            stop=stop,
            once=once,
            on_poll=_emit_json if (as_json and once) else (lambda _r: None),
            observe=served.observe_poll if served else (lambda _o, _s: None),
        )
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if not once:
        log.info("stopped; the lease is free" if watcher.lease else "stopped")
