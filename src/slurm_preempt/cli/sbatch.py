"""``slurm-preempt sbatch``: write (or submit) a job script that survives preemption."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.sbatch import render as gen

EPILOG = """\b
Example:
  slurm-preempt sbatch --nodes 2-4 --gpus-per-node 8 --time 12:00:00 \\
      --checkpoint-dir /data/ckpt/run1 --resume-flag=--resume-from-latest \\
      --template torchrun --write train.sbatch -- train.py --lr 3e-4
  slurm-preempt sbatch --array 0-9 --submit -- python sweep.py
  slurm-preempt sbatch --explain --timelimit-notice 600 -- python train.py
"""


def _opt(*names, **kwargs):
    return click.option(*names, default=None, show_default=False, **kwargs)


OPTIONS = [
    _opt("--template", metavar="plain|torchrun|array|PATH", help="Template by name, or your own .j2 file."),
    _opt("--job-name", help="Job name (default: from the command)."),
    _opt("--nodes", metavar="N|MIN-MAX", help="Node count, or a range to start on what is free."),
    _opt("--ntasks-per-node", help="Tasks per node."),
    _opt("--cpus-per-task", help="CPUs per task."),
    _opt("--gpus-per-node", metavar="[TYPE:]N", help="GPUs per node."),
    _opt("--gres", help="Generic resources, e.g. gpu:8."),
    _opt("--mem", help="Memory per node, e.g. 64G."),
    _opt("--time", help="Time limit, e.g. 12:00:00 or 1-00:00:00."),
    _opt("--partition", help="Partition."),
    _opt("--account", help="Account."),
    _opt("--qos", help="Quality of service."),
    _opt("--constraint", metavar="EXPR", help="Node features [default: preemptible]."),
    click.option("--standard", is_flag=True, default=None, help="No preemptible constraint."),
    _opt(
        "--output",
        metavar="PATTERN",
        help="Log path [default: %x-%j.out, arrays %x-%A_%a.out; %x-%j.%r.out on Slurm 25.11+].",
    ),
    _opt(
        "--slurm-version",
        metavar="X.Y|auto",
        help="The cluster's Slurm release [auto: sinfo --version]; 25.11+ logs each attempt apart (%r).",
    ),
    _opt("--error", metavar="PATTERN", help="Separate stderr log (default: with the output)."),
    _opt("--mail-user", help="Mail address for Slurm's mails."),
    _opt("--mail-type", help="Mail events, e.g. END,FAIL,REQUEUE."),
    _opt("--chdir", metavar="DIR", help="Working folder of the job."),
    _opt("--array", metavar="RANGE", help="Array indexes, e.g. 0-9%2 (uses the array template)."),
    click.option("--env", multiple=True, metavar="NAME=VALUE", help="Export a variable (repeat)."),
    click.option(
        "--setup", multiple=True, metavar="LINE", help="Shell line run first, e.g. module load (repeat)."
    ),
    click.option(
        "--sbatch", "sbatch", multiple=True, metavar="--OPT[=VALUE]", help="Any other sbatch option (repeat)."
    ),
    _opt("--comment", help="Your own job comment (the opt-in tokens are added)."),
    _opt("--checkpoint-dir", metavar="DIR", help="Checkpoint folder [default: CHECKPOINT_ROOT/JOB_NAME]."),
    _opt(
        "--checkpoint-interval",
        metavar="N|auto",
        help="Handed to the command as SLURM_PREEMPT_CHECKPOINT_INTERVAL.",
    ),
    click.option(
        "--resume-flag", multiple=True, metavar="ARG", help="Appended to the command on restart (repeat)."
    ),
    _opt(
        "--notice-signal", metavar="USR1|USR2|none", help="Signal the watcher sends the batch shell [USR1]."
    ),
    _opt(
        "--forward-signal",
        metavar="TERM|INT|USR1|USR2|HUP|none",
        help="Signal passed on to the command [TERM].",
    ),
    _opt("--fallback-after", metavar="K", help="Move to standard nodes after K preemptions."),
    _opt("--fallback-pending", metavar="SECONDS", help="... or after pending this long."),
    _opt("--fallback-to", metavar="CONSTRAINT", help="Constraint to fall back to [standard]."),
    click.option(
        "--no-fast-restart",
        "fast_restart",
        flag_value=False,
        default=None,
        help="Keep Slurm's ~2 min requeue hold.",
    ),
    _opt(
        "--timelimit-notice",
        metavar="SECONDS",
        help="Treat the time limit as a preemption, warned this early.",
    ),
    click.option(
        "--sidecar/--no-sidecar", default=None, help="Start a per-job drain watcher beside the command."
    ),
    _opt("--grace", metavar="SECONDS", help="Drain-to-removal time the sidecar assumes [300]."),
    _opt("--nproc-per-node", help="torchrun: processes per node [GPUs per node, else 1]."),
    _opt("--rdzv-port", help="torchrun: rendezvous port [29500]."),
    _opt("--torchrun", metavar="PATH", help="torchrun: the executable [this install's]."),
]


def _apply(func):
    for option in reversed(OPTIONS):
        func = option(func)
    return func


@click.command(epilog=EPILOG, context_settings={"allow_interspersed_args": False})
@_apply
@click.option("--write", "write_path", type=click.Path(path_type=Path), help="Write the script to this file.")
@click.option("--submit", is_flag=True, help="Submit it with sbatch and print the job id.")
@click.option("--test-only", is_flag=True, help="Ask sbatch --test-only whether the cluster would take it.")
@click.option("--explain", is_flag=True, help="Say in plain words what the script does on preemption.")
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def command(write_path, submit, test_only, explain, as_json, command, **options):
    """Write (or submit) a job script that survives preemption: -- COMMAND [ARGS...]"""
    if explain and not command:
        command = ("python", "train.py")
    made = gen.generate(options, list(command))
    if explain:
        click.echo(gen.explain(made.spec), nl=False)
        return
    path = gen.write_script(made.script, write_path) if write_path else None
    if test_only:
        checked = path or gen.keep_script(made.script, made.spec.job_name)
        try:
            gen.test_only(checked)
        finally:
            if path is None:
                checked.unlink()
        click.echo("sbatch --test-only: the cluster accepts this script")
    elif submit:
        path = path or gen.keep_script(made.script, made.spec.job_name)
        job_id = gen.submit(path)
        echo_json({"job_id": job_id, "script": str(path)}) if as_json else click.echo(job_id)
    elif path is None:
        click.echo(made.script, nl=False)
    elif as_json:
        echo_json({"script": str(path)})
    else:
        click.echo(f"wrote {path}", err=True)
