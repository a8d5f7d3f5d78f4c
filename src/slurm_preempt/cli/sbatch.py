"""``slurm-preempt sbatch``: write (or submit) a job script that survives preemption.

The options are not written here: each is an entry of ``sbatch.optiontable`` (the one declaration, also
behind the ``[sbatch]`` config keys and the docs), turned into a click option below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slurm_preempt.cli._output import echo_json
from slurm_preempt.sbatch import optiontable as table
from slurm_preempt.sbatch import render as gen

EPILOG = """\b
Example:
  slurm-preempt sbatch --nodes 2-4 --gpus-per-node 8 --time 12:00:00 \\
      --checkpoint-dir /data/ckpt/run1 --resume-flag=--resume-from-latest \\
      --template torchrun --write train.sbatch -- train.py --lr 3e-4
  slurm-preempt sbatch --array 0-9 --submit -- python sweep.py
  slurm-preempt sbatch --explain --timelimit-notice 600 -- python train.py
  slurm-preempt sbatch --checkpoint-interval auto --learn-from 1234 -- python train.py
"""


def click_option(option: table.Option) -> Callable[[Any], Any]:
    """One entry of the table as a click option. Nothing given means None (or an empty tuple), so the
    config's value stands; values stay text, checked by the library."""
    common: dict[str, Any] = {"help": option.help_text}
    if option.kind == table.FLAG:
        return click.option(option.flag, option.key, is_flag=True, default=None, **common)
    if option.kind == table.OFF:
        return click.option(option.flag, option.key, flag_value=False, default=None, **common)
    if option.kind == table.SWITCH:
        both = f"{option.flag}/--no-{option.flag[2:]}"
        return click.option(both, option.key, default=None, **common)
    repeat = option.kind == table.REPEAT
    return click.option(option.flag, option.key, metavar=option.metavar, multiple=repeat, **common)


def table_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(list(table.cli_options())):
        func = click_option(option)(func)
    return func


@click.command(epilog=EPILOG, context_settings={"allow_interspersed_args": False})
@table_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def command(command: tuple[str, ...], **options: Any) -> None:
    """Write (or submit) a job script that survives preemption: -- COMMAND [ARGS...]"""
    actions = {key: options.pop(key) for key in table.ACTION_KEYS}  # the rest are the script's settings
    write, submit, test_only = actions["write"], actions["submit"], actions["test_only"]
    explain, as_json = actions["explain"], actions["json"]
    if explain and not command:
        command = ("python", "train.py")
    made = gen.generate(options, list(command))
    if explain:
        click.echo(gen.explain(made.spec), nl=False)
        return
    path = gen.write_script(made.script, Path(write)) if write else None
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
