"""Who acts when several watchers share one state file: a pair on two hosts, or a restarted watcher.

Active/standby. The lease is a folder next to the state file (``sent.json.lease/``) holding one file per
term (``1``, ``2``, ...). A watcher takes term N+1 by creating its file with ``link()``, which fails when
the file exists, so of two watchers taking over at once exactly one wins (also on NFS, where this is the
classic lock-file idiom). The holder writes a beat counter into its term file every ``ttl/4`` seconds,
from its poll loop: a hung loop stops beating and loses the lease.

A standby takes over when the top term's content has not changed for ``ttl`` seconds of its *own*
monotonic clock, so no two hosts' clocks are ever compared. It does not wait when the holder released
the lease (a clean stop) or ran on this host and its process is gone (a crash, a SIGKILL): then it
takes over at once. Before each act on jobs the holder checks that no higher term exists
(``still_mine``); a holder that finds one was deposed while it was not looking, and stands by.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from slurm_preempt import procinfo
from slurm_preempt.durable import write_atomic

log = logging.getLogger(__name__)


def _process_start(pid: int) -> str | None:
    """The start tick of a process as the lease file holds it (decimal text); None if unknown."""
    ticks = procinfo.start_ticks(pid)
    return None if ticks is None else str(ticks)


class Lease:
    def __init__(
        self,
        state_path: Path,
        ttl: float,
        monotonic: Callable[[], float] = time.monotonic,
        host: str | None = None,
        pid: int | None = None,
    ):
        self.folder = Path(f"{state_path}.lease")
        self.ttl = ttl
        self.monotonic = monotonic
        self.host = host or socket.gethostname().split(".")[0]
        self.pid = pid or os.getpid()
        self.me = f"{self.host}:{self.pid}:{os.urandom(4).hex()}"
        self.term: int | None = None  # the term this process holds
        self._beat = 0
        self._renewed = float("-inf")
        self._seen: tuple[int, str] | None = None  # the top term and its content, as a standby saw them
        self._seen_since = 0.0
        self._trusted: bool | None = None

    # ------------------------------------------------------------------------------------ the loop's calls

    def hold(self) -> bool:
        """Take or keep the lease; True when this process holds it now."""
        if not self._usable():
            return True  # a lease anyone may write is no lease: act alone (logged once)
        top = self._top()
        if top is None:
            return self._take(1)
        term, text, data = top
        if data.get("holder") == self.me:
            self.term = term
            self.renew()
            return True
        if self.term is not None:
            log.warning("%s took over the lease (term %d); standing by", data.get("holder", "?"), term)
            self.term = None
        if self._expired(term, text, data):
            return self._take(term + 1)
        return False

    def renew(self) -> None:
        """Beat, at most every ttl/4 seconds (called often: each Slurm call, each pause of the loop)."""
        if self.term is None or self.monotonic() - self._renewed < self.ttl / 4:
            return
        if not self.still_mine():
            self.term = None
            return
        self._beat += 1
        self._write(self.term, {"beat": self._beat})
        self._renewed = self.monotonic()

    def still_mine(self) -> bool:
        """No higher term exists: this process may act."""
        if self._trusted is False:
            return True
        return self.term is not None and max(self._terms(), default=0) == self.term

    def release(self) -> None:
        """A clean stop: the standby may take over at once."""
        if self.term is not None and self._trusted and self.still_mine():
            self._write(self.term, {"released": True})
        self.term = None

    def holder(self) -> str:
        """Who holds it, as the top term file says (for log lines)."""
        top = self._top()
        return str(top[2].get("holder", "?")) if top else "nobody"

    # ------------------------------------------------------------------------------------ inside

    def _usable(self) -> bool:
        """The lease folder is this uid's alone (made 0700): otherwise another user could hold it
        forever and keep every watcher standing by."""
        if self._trusted is None:
            try:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                info = os.lstat(self.folder)
                # Made 0700; one of ours that others may read (an older one) is still safe to use.
                ok = stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022
                why = "" if ok else f"uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}"
            except OSError as exc:
                ok, why = False, str(exc)
            if not ok:
                log.error("lease folder %s cannot be trusted (%s): acting alone", self.folder, why)
            self._trusted = ok
        return self._trusted

    def _expired(self, term: int, text: str, data: dict) -> bool:
        if data.get("released") or self._holder_gone(data):
            return True
        now = self.monotonic()
        if self._seen != (term, text):
            self._seen, self._seen_since = (term, text), now
            return False
        return now - self._seen_since >= self.ttl

    def _holder_gone(self, data: dict) -> bool:
        """The holder ran on this host and its process is gone (or the pid is another process now)."""
        if data.get("host") != self.host or not isinstance(data.get("pid"), int):
            return False
        if not procinfo.available():  # no /proc here: cannot tell, wait for the ttl
            return False
        now = _process_start(data["pid"])
        return now is None or now != data.get("start", now)

    def _take(self, term: int) -> bool:
        self._beat = 0
        body = self._body({"beat": 0})
        tmp = self.folder / f".take-{self.me}"
        write_atomic(tmp, body)
        try:
            os.link(tmp, self.folder / str(term))
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        self.term, self._renewed = term, self.monotonic()
        for old in self._terms():
            if old < term:
                (self.folder / str(old)).unlink(missing_ok=True)
        log.info("holding the lease (term %d): this watcher acts", term)
        return True

    def _write(self, term: int, extra: dict) -> None:
        write_atomic(self.folder / str(term), self._body(extra), sync=False)

    def _body(self, extra: dict) -> str:
        start = _process_start(self.pid)
        return json.dumps({"holder": self.me, "host": self.host, "pid": self.pid, "start": start, **extra})

    def _terms(self) -> list[int]:
        try:
            return [int(n) for n in os.listdir(self.folder) if n.isdigit()]
        except FileNotFoundError:
            return []

    def _top(self) -> tuple[int, str, dict] | None:
        for term in sorted(self._terms(), reverse=True):
            try:
                text = (self.folder / str(term)).read_text()
            except FileNotFoundError:
                continue  # removed by the holder that just took over: look again below it
            try:
                data = json.loads(text)
            except ValueError:
                data = {}
            return term, text, data if isinstance(data, dict) else {}
        return None
