"""The job side's ``[resume]`` settings: each key declared once, in ``ResumeSettings`` (``keytable``).

Read by ``Run`` and by ``slurm-preempt resume``. A job must run even under a broken configuration, so
nothing here raises: an unreadable file, an unknown key or a bad value is one warning and the default
stands. The key table of docs/resume.md is written from these declarations
(``python -m slurm_preempt.cli.reference``); tests/test_settings.py checks the config example too.

``deadline_after_signal`` is not the watcher's ``grace``: that one is the provider's window from drain
to removal (300 s, ``[watch]``/``[sbatch]``); this one is how long a job assumes it has after a bare
signal (no notice file gives a deadline), e.g. SIGTERM then KillWait on a university cluster.
Import-light: standard library only.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_preempt.job.checkpoint import DEFAULT_KEEP
from slurm_preempt.keytable import key, read, seconds, whole

log = logging.getLogger(__name__)

# Keys that were renamed: a config still using the old name is told the new one.
RENAMED = {"grace": "deadline_after_signal"}


def _signals(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError('not a list of signal names such as ["USR1", "TERM"]')
    names = tuple(str(v).upper().removeprefix("SIG") for v in value)
    unknown = [n for n in names if f"SIG{n}" not in signal.Signals.__members__]
    if unknown:
        raise ValueError(f"no such signal: {', '.join(unknown)}")
    return names


def _exit_code(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError("not an exit code (0-255)")
    return value


@dataclass(frozen=True)
class ResumeSettings:
    """The ``[resume]`` section."""

    deadline_after_signal: float = key(
        30.0, seconds(), "seconds from a bare signal (no notice file) to the deadline the job assumes"
    )
    signals: tuple[str, ...] = key(("USR1", "TERM"), _signals, 'signals that mean "preemption coming"')
    keep: int = key(DEFAULT_KEEP, whole(1), "checkpoints kept")
    notice_poll: float = key(1.0, seconds(), "seconds between reads of the notice file")
    requeue_exit_code: int | None = key(
        None,
        _exit_code,
        "exit code when `scontrol requeue` is impossible (pair with `RequeueExit=` in slurm.conf)",
    )
    agree_seconds: float = key(
        0.2,
        seconds(),
        "multi-rank: exchange flags about this often (every K step boundaries); 0: at every boundary",
    )


def from_section(section: Mapping[str, Any], where: str = "the configuration") -> ResumeSettings:
    """Settings from a ``[resume]`` table; every key that cannot be used is one warning."""
    for old in (k for k in section if k in RENAMED):
        log.warning(
            "[resume] %s in %s is now called %s (seconds from a signal to the assumed deadline when "
            "no notice file gives one): rename it; the default is used until then",
            old,
            where,
            RENAMED[old],
        )
    values, problems = read(ResumeSettings, {k: v for k, v in section.items() if k not in RENAMED})
    for problem in problems:
        log.warning("ignoring %s", problem.says("resume", where))
    return ResumeSettings(**values)


def load(environ: Mapping[str, str] | None = None) -> ResumeSettings:
    """The ``[resume]`` section of the configuration found through ``environ`` (default: this process's
    environment); the defaults when it cannot be read."""
    from slurm_preempt import config

    try:
        loaded = config.load(environ=environ)
        section = loaded.section("resume")
    except Exception as exc:  # a broken config must not stop a job from running
        log.warning("ignoring the configuration: %s", exc)
        log.debug("traceback of the warning above", exc_info=True)
        return ResumeSettings()
    where = ", ".join(str(p) for p in loaded.sources) or "the configuration"
    return from_section(section, where)
