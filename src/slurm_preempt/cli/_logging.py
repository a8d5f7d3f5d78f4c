"""Logging for the command line: configured here, once, and nowhere else.

The library logs through ``logging.getLogger(__name__)`` and never adds a handler (but for ``Run`` in
a job that configured no logging, ``job/joblog.py``). A command gets one stderr handler on the
``slurm_preempt`` logger, replacing any other there: short lines for people (``testcluster: starting
munged``, the last part of the logger's name first), and for the watcher daemon a UTC timestamp on
each line, since its log is read later (journald, a file). ``-v`` shows debug lines, among them the
traceback of an error; ``-q`` (or a command's ``--quiet``/``--json``) only warnings and errors.
"""

from __future__ import annotations

import logging
import time

from slurm_preempt.job.joblog import PACKAGE, CurrentStderr


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
    WARNING with ``verbosity`` < 0. It replaces every handler there (a job's, an earlier call's), so
    no line is ever printed twice."""
    global _handler
    logger = logging.getLogger(PACKAGE)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    _handler = CurrentStderr()
    _handler.setFormatter(ShortFormatter(stamped))
    logger.addHandler(_handler)
    logger.setLevel(logging.DEBUG if verbosity > 0 else logging.WARNING if verbosity < 0 else logging.INFO)


def stamp_lines() -> None:
    """Timestamps from now on (the watcher daemon), keeping the level already chosen."""
    if _handler is not None:
        _handler.setFormatter(ShortFormatter(stamped=True))


def quiet() -> None:
    """Warnings and errors only from now on (a command's own ``--quiet``, or ``--json``)."""
    logger = logging.getLogger(PACKAGE)
    logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
