"""What one attempt knows of a coming preemption: the notice file and the signal, and the deadline each
gives. ``Run`` asks at step boundaries; the signal handler only marks the notice for a re-read.

The notice file is read at most every ``notice_poll`` seconds (a step boundary comes far more often than
a notice changes), and at once after a signal (the watcher writes the file before it signals). The
deadline is the notice's (drain time + grace) when there is one, else the signal's time +
``deadline_after_signal``. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from slurm_preempt.job.environment import JobEnv, fresh_notice
from slurm_preempt.job.signal_flag import SignalFlag
from slurm_preempt.notice import Notice
from slurm_preempt.notice import deadline as deadline_of


class NoticeWatch:
    """The notice and signal of one attempt. ``handled_events`` is shared with the caller, which adds
    the events an earlier attempt acted on (from the checkpoint it resumes from): their notice is stale."""

    def __init__(
        self,
        env: JobEnv,
        handled_events: set[str],
        *,
        notice_poll: float,
        deadline_after_signal: float,
        clock: Callable[[], float],
    ):
        self.signals = SignalFlag(heard=self.reread)
        self.handled_events = handled_events
        self._env = env
        self._poll = notice_poll
        self._after_signal = deadline_after_signal
        self._clock = clock
        self._notice: Notice | None = None
        self._checked = float("-inf")

    @property
    def notice(self) -> Notice | None:
        """The current notice for this attempt (stale ones from earlier attempts are ignored)."""
        now = self._clock()
        if now - self._checked >= self._poll:
            self._checked = now
            self._notice = fresh_notice(self._env, self.handled_events)
        return self._notice

    def reread(self) -> None:
        # Called from the signal handler too: a flag only (no I/O, no checkpoint, which hangs under
        # NCCL/DDP); the notice file is read again at the next step boundary.
        self._checked = float("-inf")

    @property
    def notified(self) -> bool:
        """This rank has seen a signal or a notice."""
        return self.signals.at is not None or self.notice is not None

    @property
    def deadline(self) -> datetime | None:
        notice = self.notice
        if notice is not None:
            return notice.deadline
        if self.signals.at is not None:
            signalled = datetime.fromtimestamp(self.signals.at, timezone.utc)
            return deadline_of(signalled, self._after_signal)
        return None

    @property
    def seconds_left(self) -> float | None:
        deadline = self.deadline
        return None if deadline is None else (deadline - datetime.now(timezone.utc)).total_seconds()

    def cause(self) -> str:
        """What told this rank, for the log: the notice's node and reason, else the signal."""
        notice = self.notice
        if notice is not None:
            return f"node {notice.node}: {notice.reason}" if notice.reason else f"node {notice.node}"
        return self.signals.name or "another rank"

    def event_acted_on(self) -> set[str]:
        """The id of the notice's event (an attempt that takes its final checkpoint acts on it)."""
        notice = self.notice
        return {notice.event_id} if notice is not None and notice.event_id else set()
