"""Which step boundaries exchange flags among ranks, so that the per-step agreement stays cheap.

An exchange is a round trip among all ranks (each waits for the slowest). With steps of a second or
more it costs next to nothing, but with steps of a millisecond an exchange at every boundary would be
a large share of the step. So ranks exchange about every ``seconds`` of training: at every K-th
boundary, where K is the step time measured over the last window divided into ``seconds``, bounded by
``max_every`` and by twice the last K (a sudden run of fast steps cannot stretch the window much).
Each rank sends its K along in the exchange and all take the smallest, so every rank counts the same
K and the next exchange happens at the same boundary everywhere. A notice therefore reaches every
rank's decision within one window: at most K steps, about ``seconds`` while the step time holds.
Standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_SECONDS = 0.2
DEFAULT_MAX_EVERY = 100


class Pacer:
    def __init__(
        self,
        seconds: float = DEFAULT_SECONDS,
        max_every: int = DEFAULT_MAX_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.seconds, self.max_every, self.clock = seconds, max(1, int(max_every)), clock
        self.every = 1  # the K agreed at the last exchange
        self._countdown = 0  # boundaries left before the next exchange
        self._since: float | None = None  # clock at the last exchange

    def due(self) -> bool:
        """Call once at every step boundary: True when this boundary exchanges."""
        if self._countdown > 0:
            self._countdown -= 1
            return False
        return True

    def proposal(self) -> int:
        """This rank's K for the next window (send it in the exchange; take the minimum)."""
        if self._since is None or self.seconds <= 0:
            return 1
        step = (self.clock() - self._since) / self.every
        wanted = self.max_every if step <= 0 else int(self.seconds / step + 1e-6)
        return max(1, min(wanted, self.max_every, 2 * self.every))

    def agreed(self, every: int) -> None:
        """Start the next window with the K all ranks agreed on."""
        self.every = max(1, int(every))
        self._countdown = self.every - 1
        self._since = self.clock()
