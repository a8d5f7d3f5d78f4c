"""The job side's ``[resume]`` settings: one dataclass, one default per key.

Read by ``Run`` and by ``slurm-preempt resume``. A job must run even under a broken configuration, so
nothing here raises: an unreadable file, an unknown key or a bad value is one warning and the default
stands. The keys and defaults are listed in docs/resume.md and etc/slurm-preempt/config.toml.example
(tests/test_settings.py checks both against this class).

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

log = logging.getLogger(__name__)

# Keys that were renamed: a config still using the old name is told the new one.
RENAMED = {"grace": "deadline_after_signal"}


@dataclass(frozen=True)
class ResumeSettings:
    deadline_after_signal: float = 30.0  # seconds from a bare signal to the assumed deadline
    signals: tuple[str, ...] = ("USR1", "TERM")  # signals that mean "preemption coming"
    keep: int = DEFAULT_KEEP  # checkpoints kept
    notice_poll: float = 1.0  # seconds between reads of the notice file
    requeue_exit_code: int | None = None  # exit code when `scontrol requeue` is impossible
    agree_seconds: float = 0.2  # multi-rank: ranks exchange flags about this often (job/pacing.py)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError("not a number of seconds >= 0")
    return float(value)


def _signals(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError('not a list of signal names such as ["USR1", "TERM"]')
    names = tuple(str(v).upper().removeprefix("SIG") for v in value)
    unknown = [n for n in names if f"SIG{n}" not in signal.Signals.__members__]
    if unknown:
        raise ValueError(f"no such signal: {', '.join(unknown)}")
    return names


def _keep(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("not a whole number >= 1")
    return value


def _exit_code(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError("not an exit code (0-255)")
    return value


READERS = {
    "deadline_after_signal": _seconds,
    "signals": _signals,
    "keep": _keep,
    "notice_poll": _seconds,
    "requeue_exit_code": _exit_code,
    "agree_seconds": _seconds,
}


def from_section(section: Mapping[str, Any], where: str = "the configuration") -> ResumeSettings:
    """Settings from a ``[resume]`` table; every key that cannot be used is one warning."""
    values: dict[str, Any] = {}
    for key, value in section.items():
        if key in RENAMED:
            log.warning(
                "[resume] %s in %s is now called %s (seconds from a signal to the assumed deadline when "
                "no notice file gives one): rename it; the default is used until then",
                key,
                where,
                RENAMED[key],
            )
        elif key not in READERS:
            log.warning("ignoring unknown key [resume] %s in %s", key, where)
        else:
            try:
                values[key] = READERS[key](value)
            except ValueError as exc:
                log.warning("ignoring [resume] %s = %r in %s: %s", key, value, where, exc)
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
