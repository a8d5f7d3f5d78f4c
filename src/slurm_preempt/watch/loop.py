"""The watcher's loop, and what it promises a supervisor (systemd, or a person reading its log).

* Slurm not answering (controller down, slow, restarting) is expected: the poll is retried with
  exponential back-off up to ``max_backoff``, logged at the first failure, every tenth, and when Slurm
  answers again. The loop never exits for it.
* Anything else is a bug or a broken machine: logged with its traceback, the poll retried the same
  way; after ``crash_after`` such polls in a row the loop raises ``WatcherError`` and the process exits
  non-zero, so that systemd restarts it (``Restart=on-failure``) rather than keep a broken watcher.
* systemd's notify protocol (``Type=notify``): ``READY=1`` after the first poll, a ``STATUS=`` line after
  each, ``WATCHDOG=1`` between Slurm calls and while waiting, ``STOPPING=1`` at the end.
* A clean stop (SIGTERM sets ``stop``) ends after the current poll and releases the lease, so a standby
  takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from slurm_preempt.errors import SlurmError, WatcherError
from slurm_preempt.watch.actions import Emit
from slurm_preempt.watch.sdnotify import Notifier
from slurm_preempt.watch.watcher import PollResult, Watcher

log = logging.getLogger(__name__)

Waiter = Callable[[float], bool]  # ``threading.Event.wait``: True when told to stop


class _Health:
    """Consecutive failures: of Slurm (back off), and unexpected (back off, then give up)."""

    def __init__(self, crash_after: int):
        self.crash_after = crash_after
        self.failures = 0  # polls in a row that failed, for any reason
        self.errors = 0  # of which unexpected
        self.last = "ok"  # how the last poll went: ok, slurm_error or error (the metrics)

    def ok(self) -> None:
        if self.failures:
            log.info("polls work again after %d failed one(s)", self.failures)
        self.failures = self.errors = 0
        self.last = "ok"

    def slurm(self, exc: SlurmError) -> None:
        self.failures += 1
        self.last = "slurm_error"
        if self.failures == 1 or self.failures % 10 == 0:
            log.warning("Slurm did not answer (%s); retry %d, backing off", exc, self.failures)

    def unexpected(self, exc: Exception) -> None:
        self.failures += 1
        self.last = "error"
        self.errors += 1
        log.error("unexpected %s: %s (%d in a row)", type(exc).__name__, exc, self.errors, exc_info=True)
        if self.errors >= self.crash_after:
            raise WatcherError(
                f"{self.errors} polls in a row failed with an unexpected error (last: {type(exc).__name__}: "
                f"{exc}); exiting so that a supervisor restarts the watcher"
            ) from exc


def run(
    watcher: Watcher,
    stop: threading.Event | None = None,
    once: bool = False,
    on_poll: Emit = lambda _r: None,
    notifier: Notifier | None = None,
    observe: Callable[[str, float], None] = lambda _outcome, _seconds: None,
) -> int:
    """Poll every ``interval`` seconds until ``stop`` is set (or, for a sidecar, the job ends).
    Returns 0; raises WatcherError after ``crash_after`` unexpected errors in a row. In ``once`` mode
    every error reaches the caller. ``observe`` hears each poll's outcome (``ok``, ``standby``,
    ``slurm_error``, ``error``) and its seconds (the metrics)."""
    stop = stop or threading.Event()
    notifier = notifier or Notifier()
    watcher.on_beat = notifier.ping
    health = _Health(watcher.settings.crash_after)
    ready = False
    try:
        while True:
            began = time.monotonic()
            result = _poll(watcher, health, once, on_poll)
            observe(_outcome(result, health), time.monotonic() - began)
            if not ready:
                notifier.send("READY=1")
                ready = True
            notifier.send(f"STATUS={_status(watcher, result, health)}")
            if once or (result is not None and result.job_ended):
                return 0
            if _pause(stop.wait, _wanted(watcher, health) - (time.monotonic() - began), watcher, notifier):
                return 0
    finally:
        notifier.send("STOPPING=1")
        watcher.release()


def _poll(watcher: Watcher, health: _Health, once: bool, on_poll: Emit) -> PollResult | None:
    try:
        result = watcher.poll_once()
    except SlurmError as exc:
        if once:
            raise
        health.slurm(exc)
        return None
    except Exception as exc:
        if once:
            raise
        health.unexpected(exc)
        return None
    health.ok()
    on_poll(result.to_json())
    return result


def _outcome(result: PollResult | None, health: _Health) -> str:
    return "standby" if result is not None and result.standby else health.last


def _wanted(watcher: Watcher, health: _Health) -> float:
    settings = watcher.settings
    if health.failures == 0:
        return settings.interval
    return min(settings.max_backoff, settings.interval * 2**health.failures)


def _pause(wait: Waiter, seconds: float, watcher: Watcher, notifier: Notifier) -> bool:
    """Wait ``seconds`` (True when told to stop), beating the lease and the watchdog meanwhile."""
    steps = [s for s in (watcher.beat_every(), notifier.pause) if s]
    step = min(steps) if steps else None
    left = max(0.0, seconds)
    while True:
        chunk = left if step is None else min(left, step)
        if wait(chunk):
            return True
        left -= chunk
        if left <= 0:
            return False
        watcher.beat()


def _status(watcher: Watcher, result: PollResult | None, health: _Health) -> str:
    if result is None:
        return f"polls failing ({health.failures} in a row), backing off"
    if result.standby:
        return "standing by: another watcher holds the lease"
    return f"watching: {len(result.draining)} node(s) going away, last poll {result.queries} Slurm queries"
