"""Preemption signals as a flag: the handler notes the first signal and its time, nothing more.

No I/O and no checkpoint inside a signal handler (under NCCL/DDP that hangs: a collective started from
a handler meets ranks that are elsewhere); ``Run`` acts at the next step boundary. Handlers can only be
installed from the main thread (Python's rule); elsewhere notices come by file only.
Standard library only.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class SignalFlag:
    """The first preemption signal (``at``: wall clock, ``name``), from handlers installed here.
    ``heard`` is called from the handler (it must only set flags)."""

    def __init__(self, heard: Callable[[], None] = lambda: None):
        self.at: float | None = None
        self.name = ""
        self.muted = False  # our own `scontrol requeue` sends SIGTERM: not a new preemption
        self._heard = heard
        self._previous: dict[int, Any] = {}

    def install(self, names: tuple[str, ...]) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("signal handlers can only be installed from the main thread; notices by file only")
            return
        for name in names:
            number = getattr(signal, f"SIG{name.upper().removeprefix('SIG')}")
            self._previous[number] = signal.signal(number, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers that were there before ``install``."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def ignore(self) -> None:
        """SIG_IGN for the signals installed here. Our own `scontrol requeue` SIGTERMs the job; a
        Python handler would swallow it, but the interpreter puts SIG_DFL back while it shuts down,
        and a SIGTERM landing then ends the process with 143 instead of the exit code we chose.
        SIG_IGN survives the shutdown."""
        if threading.current_thread() is threading.main_thread():
            for number in self._previous:
                signal.signal(number, signal.SIG_IGN)

    def _on_signal(self, number, _frame) -> None:
        if self.muted or self.at is not None:
            return
        self.at = time.time()
        self.name = signal.Signals(number).name
        self._heard()
