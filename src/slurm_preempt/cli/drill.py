"""``slurm-preempt drill``: rehearse preemptions on the local cluster (or, explicitly, a real one)."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_preempt import config
from slurm_preempt.cli import _logging
from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.errors import UsageError
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS
from slurm_preempt.rehearsal import drill
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import expand_nodes


@click.command()
@click.option("--nodes", help="Nodes to preempt, as a Slurm node list (pre[1-2]).")
@click.option("--job", "job_id", help="Preempt the nodes this job runs on.")
@click.option(
    "--grace",
    type=float,
    default=DEFAULT_GRACE_SECONDS,
    show_default=True,
    help="Seconds from drain (T+0) to removal: the providers' real window by default.",
)
@click.option(
    "--pause",
    type=float,
    default=10,
    show_default=True,
    help="Seconds a removed node stays away before it comes back.",
)
@click.option("--reason", default=drill.DEFAULT_REASON, show_default=True, help="Drain reason.")
@click.option("--random", "random_mode", is_flag=True, help="Poisson preemptions over --duration.")
@click.option("--mtbp", type=float, help="Random mode: mean seconds between preemptions.")
@click.option("--duration", type=float, help="Random mode: how long to keep preempting.")
@click.option(
    "--correlated", type=int, default=1, show_default=True, help="Random mode: nodes taken at once."
)
@click.option("--seed", type=int, help="Random mode: seed, to replay a trace.")
@click.option(
    "--timeout",
    type=float,
    default=600,
    show_default=True,
    help="Seconds to wait for the jobs to run again after the nodes are back.",
)
@click.option("--state-dir", type=click.Path(path_type=Path), help="Ledger folder (default: config).")
@click.option("--real-cluster", is_flag=True, help="Allow draining and downing nodes of a real cluster.")
@json_option
def command(
    nodes,
    job_id,
    grace,
    pause,
    reason,
    random_mode,
    mtbp,
    duration,
    correlated,
    seed,
    timeout,
    state_dir,
    real_cluster,
    as_json,
):
    """Drain nodes at T+0, remove them at T+grace, bring them back, and report what each job did.

    \b
    Example:
      slurm-preempt drill --job 1234 --grace 20
      slurm-preempt drill --random --mtbp 60 --duration 300 --grace 20 --correlated 2 --json
    """
    slurm = Slurm()
    ops = drill.node_ops(slurm, allow_real=real_cluster)
    state_dir = state_dir or config.load().state_dir()
    if as_json:
        _logging.quiet()
    runner = drill.Drill(slurm, ops, state_dir=state_dir)
    if random_mode:
        if mtbp is None or duration is None:
            raise UsageError("--random needs --mtbp and --duration")
        candidates = (
            expand_nodes(nodes)
            if nodes
            else [n.name for n in slurm.nodes() if n.has_feature("preemptible") and n.available]
        )
        events = runner.random(candidates, mtbp, duration, grace, pause, correlated, seed, reason)
    else:
        if bool(nodes) == bool(job_id):
            raise UsageError("name the nodes (--nodes) or a job (--job), one of the two")
        targets = expand_nodes(nodes) if nodes else drill.nodes_of_job(slurm, job_id)
        events = [runner.preempt(targets, grace, pause, reason, timeout)]
    if as_json:
        echo_json({"summary": drill.summary(events), "events": [e.to_json() for e in events]})
        return
    click.echo(drill.drill_text(events), nl=False)
