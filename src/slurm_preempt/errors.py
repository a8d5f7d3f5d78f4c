"""Typed errors of slurm-preempt.

The library raises these; the CLI turns each into a one-line message and the exit code below, in one
place (``slurm_preempt.cli``). Every error's ``str()`` is that one line: it must say what went wrong
and, where there is one, what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence

# Exit codes, one per family. 2 is click's own code for a usage error, so our usage-like errors share it.
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_SLURM = 4
EXIT_MISSING = 5
EXIT_CHECKPOINT = 6
EXIT_TIMEOUT = 7


class SlurmPreemptError(Exception):
    """Base of every error the CLI reports as one line."""

    exit_code = EXIT_ERROR


class UsageError(SlurmPreemptError):
    """A value given by the user is not acceptable (bad option, bad range, bad name)."""

    exit_code = EXIT_USAGE


class ConfigError(SlurmPreemptError):
    """A configuration file or setting is wrong."""

    exit_code = EXIT_CONFIG


class MissingDependencyError(SlurmPreemptError):
    """Something the machine needs is not installed (Slurm, munge, a Debian package)."""

    exit_code = EXIT_MISSING


class SlurmError(SlurmPreemptError):
    """A Slurm command failed. Carries the argv, exit code and stderr for logs and tests."""

    exit_code = EXIT_SLURM

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, message: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        first_line = next((ln.strip() for ln in stderr.splitlines() if ln.strip()), "")
        text = message or f"`{' '.join(self.argv)}` failed (exit {returncode})"
        super().__init__(f"{text}: {first_line}" if first_line else text)


class SlurmNotFoundError(SlurmError, MissingDependencyError):
    """The Slurm command is not on PATH."""

    exit_code = EXIT_MISSING

    def __init__(self, argv: Sequence[str]):
        super().__init__(
            argv,
            None,
            "",
            f"Slurm command `{argv[0]}` not found: install slurm-client "
            "(apt-get install slurm-client) or put Slurm's bin folder on PATH",
        )


class SlurmTimeoutError(SlurmError):
    """The Slurm command did not answer in time (controller down or overloaded)."""

    exit_code = EXIT_TIMEOUT

    def __init__(self, argv: Sequence[str], timeout: float):
        self.timeout = timeout
        super().__init__(argv, None, "", f"`{' '.join(argv)}` gave no answer within {timeout:g} s")


class JobGoneError(SlurmError):
    """The job named no longer exists (it ended between a query and an action)."""


class WatcherError(SlurmPreemptError):
    """The drain watcher gave up (the same unexpected error poll after poll): exit so a supervisor
    restarts it."""


class CheckpointError(SlurmPreemptError):
    """A checkpoint could not be saved or no valid one could be loaded."""

    exit_code = EXIT_CHECKPOINT


class ClusterError(SlurmPreemptError):
    """The local test cluster could not be started, found or stopped."""
