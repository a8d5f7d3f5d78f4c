"""systemd's notify protocol, without a dependency: one datagram per message to ``$NOTIFY_SOCKET``.

With ``Type=notify`` the unit is "started" once the watcher says ``READY=1``; with ``WatchdogSec=``
systemd restarts it when no ``WATCHDOG=1`` comes for that long (a hung loop, not a slow Slurm: the loop
pings between Slurm calls, and each call has a timeout). Outside systemd ``$NOTIFY_SOCKET`` is unset
and every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(
        self, environ: Mapping[str, str] | None = None, monotonic: Callable[[], float] = time.monotonic
    ):
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket: a leading NUL byte on Linux.
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog = _watchdog_seconds(env)
        self.monotonic = monotonic
        self._pinged = float("-inf")
        self._failed = False

    @property
    def pause(self) -> float | None:
        """The longest the loop may go without a ping: half the watchdog period (systemd's advice)."""
        return self.watchdog / 2 if self.watchdog else None

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall("\n".join(lines).encode())
        except OSError as exc:
            if not self._failed:  # once: a missing socket must not flood the log
                log.warning("cannot notify systemd at %s: %s", self.address.lstrip("\0"), exc)
            self._failed = True

    def ping(self) -> None:
        """``WATCHDOG=1``, at most four times per watchdog period."""
        if self.watchdog and self.monotonic() - self._pinged >= self.watchdog / 4:
            self._pinged = self.monotonic()
            self.send("WATCHDOG=1")


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):  # meant for another process (we were started by a wrapper)
        return None
    return int(usec) / 1e6
