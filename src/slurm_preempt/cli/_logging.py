"""Logging for the command line: configured here, once, and nowhere else.

The library logs through ``logging.getLogger(__name__)`` and never adds a handler. A command gets one
stderr handler on the ``slurm_preempt`` logger: short lines for people (``testcluster: starting munged``,
the last part of the logger's name first), and for the watcher daemon a UTC timestamp on each line,
since its log is read later (journald, a file). ``-v`` shows debug lines, among them the traceback of
an error; ``-q`` shows only warnings and errors.
"""

from __future__ import annotations

import logging
import sys
import time

PACKAGE = "slurm_preempt"


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (click's test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class ShortFormatter(logging.Formatter):
    def __init__(self, stamped: bool = False) -> None:
        super().__init__()
        self.stamped = stamped

    def format(self, record: logging.LogRecord) -> str:
        who = "slurm-preempt" if record.name == PACKAGE else record.name.rsplit(".", 1)[-1]
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        line = f"{who}: {level}{record.getMessage()}"
        if self.stamped:
            line = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime(record.created)) + line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


_handler: logging.Handler | None = None


def configure(verbosity: int = 0, stamped: bool = False) -> None:
    """One stderr handler on the package logger: INFO by default, DEBUG with ``verbosity`` > 0,
    WARNING with ``verbosity`` < 0. Calling it again replaces the handler (never doubles lines)."""
    global _handler
    logger = logging.getLogger(PACKAGE)
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = _CurrentStderr()
    _handler.setFormatter(ShortFormatter(stamped))
    logger.addHandler(_handler)
    logger.setLevel(logging.DEBUG if verbosity > 0 else logging.WARNING if verbosity < 0 else logging.INFO)


def stamp_lines() -> None:
    """Timestamps from now on (the watcher daemon), keeping the level already chosen."""
    if _handler is not None:
        _handler.setFormatter(ShortFormatter(stamped=True))
