"""An in-memory world for the watcher's unit tests: the fake Slurm, an injected clock, a state folder,
and what the tests read back (ledger kinds, notices, signals sent)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fakeslurm import Clock, FakeSlurm
from slurm_preempt import ledger
from slurm_preempt.notice import Notice, notice_path, read_notice
from slurm_preempt.watch.lease import Lease
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.sources import Drain, SourceError
from slurm_preempt.watch.watcher import Watcher, load_sent, state_path

OPTED = "slurm-preempt:signal=USR1"
REASON = "TogetherPreemptionNotified: reclaimed"
GRACE = 300.0


@dataclass
class World:
    clock: Clock
    slurm: FakeSlurm
    state_dir: Path

    def watcher(
        self, job_id: str | None = None, sources=(), user: str | None = None, lease=None, **settings
    ) -> Watcher:
        """A watcher whose state is loaded from disk: a second one is a restarted watcher."""
        sent = load_sent(state_path(self.state_dir, job_id, user))
        values = {"grace": GRACE, **settings}
        return Watcher(
            self.slurm,
            Settings(**values),
            sent,
            self.state_dir,
            sources,
            job_id=job_id,
            clock=self.clock,
            user=user,
            lease=lease,
        )

    def pair_member(self, host: str, ticks: Ticks, **settings) -> Watcher:
        """One of two watchers sharing the daemon's state (two hosts: each its own monotonic clock)."""
        lease = Lease(state_path(self.state_dir), ttl=30, monotonic=ticks, host=host, pid=1)
        watcher = self.watcher(lease=lease, **settings)
        watcher.outbox.monotonic = ticks
        return watcher

    def kinds(self, job_id: str) -> list[str]:
        return [e["kind"] for e in ledger.events(self.state_dir, job_id)]

    def notice(self, job_id: str) -> Notice | None:
        return read_notice(notice_path(self.state_dir, job_id))


class Ticks:
    """A host's monotonic clock, moved on by the test."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Killed(BaseException):
    """The watcher's process dies here (SIGKILL): nothing after this line of it runs."""


@pytest.fixture
def world(tmp_path) -> World:
    clock = Clock()
    return World(clock, FakeSlurm(clock), tmp_path / "state")


@dataclass
class ListSource:
    """A provider API whose answer the test sets; ``failing`` makes it raise."""

    name: str = "together"
    drains: list[Drain] = field(default_factory=list)
    failing: bool = False

    def fetch(self) -> list[Drain]:
        if self.failing:
            raise SourceError("https://api.example/v1 answered HTTP 500")
        return list(self.drains)


def signalled(world: World) -> list[str]:
    return [i for call in world.slurm.called("signal_many") for i in call["job_ids"]]
