"""The ``slurm-preempt`` command: a thin click layer over the library.

Subcommands live one per module and are imported only when called, so ``slurm-preempt resume ...``
inside a job never pays for jinja2. Errors are mapped to messages and exit codes here, once:
a ``SlurmPreemptError`` (or an ``OSError``) becomes one line on stderr and its exit code, and so does
any other exception (a bug); the traceback is logged at debug level, shown with ``-v``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging

import click

from slurm_preempt.cli import _logging
from slurm_preempt.errors import EXIT_ERROR, SlurmPreemptError

log = logging.getLogger(__name__)

# name -> (module under cli/, attribute). Loaded on first use: `slurm-preempt resume env` in a job
# imports only what it runs. Only the group's own --help loads them all, for their one-line help.
COMMANDS = {
    "sbatch": ("sbatch", "command"),
    "resume": ("resume", "group"),
    "watch": ("watch", "command"),
    "hooks": ("hooks", "group"),
    "history": ("report", "history"),
    "report": ("report", "report"),
    "drill": ("drill", "command"),
    "simulate": ("simulate", "command"),
    "testcluster": ("testcluster", "group"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(n for n, (mod, _attr) in COMMANDS.items() if _exists(mod))

    def get_command(self, ctx, name):
        if name not in COMMANDS or not _exists(COMMANDS[name][0]):
            return None
        mod, attr = COMMANDS[name]
        return getattr(importlib.import_module(f"{__name__}.{mod}"), attr)

    def format_commands(self, ctx, formatter):
        # Each command's first sentence, whole (write_dl wraps it): one source for the line.
        rows = [(n, self.get_command(ctx, n).get_short_help_str(200)) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SlurmPreemptError as exc:
            log.debug("traceback of the error below", exc_info=True)
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except OSError as exc:
            log.debug("traceback of the error below", exc_info=True)
            where = f": {exc.filename}" if exc.filename else ""
            click.echo(f"Error: {exc.strerror or exc}{where}", err=True)
            ctx.exit(EXIT_ERROR)
        except KeyboardInterrupt:
            click.echo("Interrupted", err=True)
            ctx.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:  # a bug: one line for people, the traceback with -v
            log.debug("traceback of the error below", exc_info=True)
            click.echo(
                f"Error: unexpected {type(exc).__name__}: {exc} (a bug in slurm-preempt: run the command "
                "again with -v for the traceback, and report it)",
                err=True,
            )
            ctx.exit(EXIT_ERROR)


def _exists(module: str) -> bool:
    return importlib.util.find_spec(f"{__name__}.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-preempt")
@click.option("-v", "--verbose", count=True, help="More log lines (-v: debug, with tracebacks).")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors on stderr.")
def main(verbose: int, quiet: bool) -> None:
    """Run Slurm jobs on preemptible (spot, borrowed) nodes without losing work.

    \b
    Example:
      slurm-preempt testcluster up
      slurm-preempt sbatch --nodes 1-2 --submit -- python train.py
      slurm-preempt -v watch --cluster --once
    """
    _logging.configure(-1 if quiet else verbose)
