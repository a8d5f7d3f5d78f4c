"""``slurm-preempt resume``: the resume library for shell jobs."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.job.checkpoint import DEFAULT_KEEP
from slurm_preempt.job.environment import ENV_CHECKPOINT_DIR

dir_option = click.option(
    "--checkpoint-dir",
    "-d",
    type=click.Path(path_type=Path, file_okay=False),
    envvar=ENV_CHECKPOINT_DIR,
    help=f"The job's checkpoint folder (default ${ENV_CHECKPOINT_DIR}).",
)
required_dir_option = click.option(
    "--checkpoint-dir",
    "-d",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    envvar=ENV_CHECKPOINT_DIR,
    help=f"The job's checkpoint folder (default ${ENV_CHECKPOINT_DIR}).",
)


@click.group()
def group():
    """Job-side helpers for shell jobs: restart facts, notices, checkpoints, requeue self.

    \b
    Example (inside a job script):
      eval "$(slurm-preempt resume env -d ckpt)"
      slurm-preempt resume save -d ckpt --step 40 state.txt
      slurm-preempt resume wait && slurm-preempt resume requeue
    """


@group.command()
@dir_option
@json_option
def env(checkpoint_dir, as_json):
    """Print export lines: restart count, attempt, latest intact checkpoint and its step, node counts.

    SLURM_PREEMPT_RESUME_FLAG is 1 when there is a checkpoint to resume from, else empty.

    \b
    Example:
      eval "$(slurm-preempt resume env --checkpoint-dir ckpt)"
      [ -n "$SLURM_PREEMPT_RESUME_FLAG" ] && cp "$SLURM_PREEMPT_LATEST_CHECKPOINT"/state.txt .
    """
    from slurm_preempt.job.shell import env_info, export_lines

    info = env_info(checkpoint_dir)
    if as_json:
        echo_json(info)
    else:
        click.echo("\n".join(export_lines(info)))


@group.command()
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 7).")
@click.option("--pid", type=int, help="Stop waiting when this process ends (exit 1), e.g. the job's work.")
@click.option(
    "--deadline-after-signal",
    type=click.FloatRange(min=0),
    help="After a bare USR1/TERM (no notice file), the deadline is this many seconds later "
    "[config: [resume] deadline_after_signal, 30].",
)
@dir_option
@json_option
def wait(timeout, pid, deadline_after_signal, checkpoint_dir, as_json):
    """Block until a preemption notice arrives for this attempt (notice file, or USR1/TERM to this process).

    Exit 0: notice (prints the deadline: the notice's, else the signal's time plus
    --deadline-after-signal); 1: --pid ended first; 7: --timeout passed. With --checkpoint-dir, notices
    already handled by the checkpoint's attempt are ignored.

    \b
    Example:
      slurm-preempt resume wait --pid "$work" --timeout 3600
    """
    from slurm_preempt.job.shell import wait_for_notice

    result = wait_for_notice(timeout, checkpoint_dir, pid, deadline_after_signal=deadline_after_signal)
    if as_json:
        notice = result.notice.to_json() if result.notice is not None else None
        echo_json({"code": result.code, "what": result.what, "deadline": result.deadline, "notice": notice})
    else:
        tail = f", deadline {result.deadline}" if result.deadline else ""
        click.echo(f"{result.what}{tail}")
    raise SystemExit(result.code)


@group.command()
@dir_option
def requeue(checkpoint_dir):
    """Requeue this job (scontrol requeue $SLURM_JOB_ID; an array task requeues only itself).

    Exit 0 when Slurm took the request: then exit 0 from the job script too. When scontrol is missing or
    fails: exit requeue_exit_code from [resume] in the config (for sites with RequeueExit=), else 4.

    \b
    Example:
      slurm-preempt resume requeue -d ckpt && exit 0
    """
    from slurm_preempt.job.shell import requeue as requeue_job

    ok, message, code = requeue_job(checkpoint_dir)
    click.echo(message, err=not ok)
    raise SystemExit(code)


@group.command()
@click.option(
    "--min-nodes", required=True, type=click.IntRange(min=1), help="The job's MIN of --nodes=MIN-MAX."
)
@click.option(
    "--wait-steps",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for the job's steps to end first.",
)
@json_option
def shrink(min_nodes, wait_steps, as_json):
    """Go on without the nodes that leave: give them back to Slurm, keep the others (same attempt).

    For the batch script of a --nodes=MIN-MAX job, once its step has ended after a notice. Exit 0: the
    job shrank; prints the export/unset lines of its new environment (eval them). Exit 1: it did not
    (the batch host leaves, fewer than MIN would stay, --stepmgr, Slurm refused, a second drain came):
    prints why in one line; requeue the job then.

    \b
    Example (in a job script, after the command exited on a notice):
      out=$(slurm-preempt resume shrink --min-nodes 2 --wait-steps 30) && eval "$out" || echo "$out"
    """
    from slurm_preempt.job.shrink import shrink_in_place

    outcome = shrink_in_place(min_nodes, wait_steps)
    if as_json:
        echo_json(
            {"shrunk": outcome.shrunk, "why_not": outcome.why_not, "lines": outcome.lines, **outcome.event}
        )
    else:
        click.echo("\n".join(outcome.lines) if outcome.shrunk else outcome.why_not)
    raise SystemExit(0 if outcome.shrunk else 1)


@group.command()
@required_dir_option
@click.option("--step", required=True, type=click.IntRange(min=0), help="The step this state belongs to.")
@click.option(
    "--keep", type=click.IntRange(min=1), help=f"Checkpoints to keep [config: [resume] keep, {DEFAULT_KEEP}]."
)
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True))
@json_option
def save(checkpoint_dir, step, keep, paths, as_json):
    """Copy files and folders into a new checkpoint, atomically (complete or invisible).

    \b
    Example:
      slurm-preempt resume save --checkpoint-dir ckpt --step 120 state.txt model/
    """
    from slurm_preempt.job.shell import save_paths

    found = save_paths(checkpoint_dir, step, list(paths), keep)
    if as_json:
        echo_json(
            {"step": found.step, "path": found.path, "bytes": found.nbytes, "files": found.manifest["files"]}
        )
    else:
        click.echo(found.path)


@group.command()
@required_dir_option
@json_option
def latest(checkpoint_dir, as_json):
    """Print the folder of the newest intact checkpoint (damaged newer ones are skipped with a warning).

    Exit 6 when there is none (a first run).

    \b
    Example:
      if ckpt=$(slurm-preempt resume latest -d ckpt); then cp -r "$ckpt"/model .; fi
    """
    from slurm_preempt.job.shell import latest as latest_checkpoint

    found = latest_checkpoint(checkpoint_dir)
    if as_json:
        echo_json({"step": found.step, "path": found.path, "bytes": found.nbytes, "meta": found.meta})
    else:
        click.echo(found.path)


@group.command()
@click.argument("done", type=click.IntRange(min=0))
@click.argument("total", type=click.IntRange(min=1))
def progress(done, total):
    """Record this job's progress (DONE of TOTAL steps) for its fallback-deadline.

    The watcher judges a job submitted with `sbatch --fallback-deadline` from it (a Run given
    total_steps records it with each checkpoint). Call it after each checkpoint.

    \b
    Example:
      slurm-preempt resume save -d ckpt --step 120 state.txt && slurm-preempt resume progress 120 1000
    """
    from slurm_preempt.job.shell import record_progress

    click.echo(record_progress(done, total))


@group.command()
@click.option("--save-seconds", "-c", required=True, type=float, help="Time one checkpoint takes.")
@click.option("--mtbi", "-m", required=True, type=float, help="Mean seconds between preemptions.")
@json_option
def interval(save_seconds, mtbi, as_json):
    """Optimal checkpoint interval (Young, and Daly's higher-order form) in seconds.

    \b
    Example:
      slurm-preempt resume interval --save-seconds 90 --mtbi 14400
    """
    from slurm_preempt.errors import UsageError
    from slurm_preempt.job.interval import daly, young_daly

    try:
        values = {"young": young_daly(save_seconds, mtbi), "daly": daly(save_seconds, mtbi)}
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        echo_json(values)
    else:
        click.echo(f"young {values['young']:.1f} s  daly {values['daly']:.1f} s")
