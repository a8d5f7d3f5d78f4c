"""How a job's key lines reach its log, while the library never configures logging behind a program's back.

The library logs through ``logging.getLogger(__name__)``, like every module. But a job's log must show
its key lines (resuming from step N, the preemption notice and the final checkpoint, the requeue, a
damaged checkpoint skipped) even from a training script that never configured logging, where Python
would drop INFO lines. So ``Run``, built once at the start of a job, calls ``show_on_stderr``:

- by default it adds one stderr handler to the ``slurm_preempt`` logger (INFO, lines
  ``slurm-preempt: <message>``) only when neither that logger nor the root logger has a handler: a
  program that configured logging (``logging.basicConfig``, a framework) gets the lines through its own
  handlers and at its own level, never twice;
- a handler of the program's own on the ``slurm_preempt`` logger (``logging.NullHandler()`` for none)
  keeps it from being added; the internal ``Wiring(log_to_stderr=True)`` (tests) adds it even when the
  root logger has handlers, ``False`` never does;
- ``Run.close()`` (or leaving ``with Run(...)``) takes it away again.

The command line configures logging itself (``slurm_preempt.cli._logging``), with the same stderr
handler class. Import-light: standard library only.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

PACKAGE = "slurm_preempt"


class CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class JobFormatter(logging.Formatter):
    """``slurm-preempt: resuming from step 40 ...``, ``slurm-preempt: warning: ...``."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = f"slurm-preempt: {level}{record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def show_on_stderr(when: bool | None = None) -> Callable[[], None] | None:
    """Add the job's stderr handler as the module docstring says; return how to take it away again
    (None when nothing was added)."""
    package = logging.getLogger(PACKAGE)
    if when is False or package.handlers:
        return None
    if when is None and logging.getLogger().handlers:
        return None
    handler = CurrentStderr()
    handler.setFormatter(JobFormatter())
    package.addHandler(handler)
    set_level = package.level == logging.NOTSET
    if set_level:
        package.setLevel(logging.INFO)

    def take_away() -> None:
        package.removeHandler(handler)
        if set_level:
            package.setLevel(logging.NOTSET)

    return take_away
