"""The drain watcher: notice draining preemptible nodes, tell their jobs, restart requeued jobs fast.

``Watcher.poll_once()`` does one round and returns what it did; ``run()`` is the thin loop around it
(interval, back-off on a slow or dead controller, stop event). Two modes:

Cluster daemon (``job_id`` None), Slurm queries per poll, whatever the number of nodes:

1. ``sinfo -N -t drain,down`` (every drained or down node, with reason and time), always;
2. ``squeue -w <nodes> -t running,configuring`` only when a node newly started draining (or an
   earlier round on it failed, or its enforcement moment came): one call for all such nodes;
3. ``squeue -t pending`` when fast restart or fallback is on, for the requeued opted-in jobs (and
   those a failed launch holds: ``launchhold``).

So at most 3 queries, plus the actions: one ``scancel --signal`` for all jobs told (in a few chunks
run side by side) and one ``scontrol update`` per job restarted or moved.

Sidecar (``job_id`` set, run by the job itself): ``squeue -j J`` then ``sinfo -n <J's nodes>``; it tells
only its own job and ends when the job stops running.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_preempt.errors import SlurmError
from slurm_preempt.notice import deadline, to_text, utcnow
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.watch import launchhold, sentstate
from slurm_preempt.watch.actions import Clock, Context, Emit, enforce, enforce_due, restart, tell_many
from slurm_preempt.watch.sentstate import NodeEvent, SentState
from slurm_preempt.watch.sources import Drain, Source, SourceError, slurm_drains

if TYPE_CHECKING:
    from slurm_preempt.watch.settings import Settings

log = logging.getLogger(__name__)

NODE_STATES = "drain,down"  # sinfo -t: DRAIN covers DRAINING and DRAINED
RUNNING_STATES = "running,configuring"  # squeue -t: the jobs still on a node
ALIVE_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED"}
# A provider event is kept this long past its deadline: the provider's clock and ours may differ a
# little, and a node still listed as going away must not look like a new event.
PROVIDER_EVENT_LINGER = timedelta(seconds=60)


@dataclass
class PollResult:
    queries: int = 0  # sinfo/squeue calls made
    draining: list[str] = field(default_factory=list)  # nodes in a drain event
    new_events: list[str] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    job_ended: bool = False  # sidecar: its job stopped running

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "poll",
            "queries": self.queries,
            "draining": self.draining,
            "new_events": self.new_events,
            "actions": self.actions,
            "job_ended": self.job_ended,
        }


class Watcher:
    """One watcher: its Slurm (anything with the calls of ``WatcherSlurm``), settings, saved state and
    extra sources. ``clock`` gives the present moment (tests inject one; nothing here sleeps)."""

    def __init__(
        self,
        slurm: WatcherSlurm,
        settings: Settings,
        sent: SentState,
        state_dir: Path | None,
        sources: Sequence[Source] = (),
        emit: Emit = lambda _e: None,
        job_id: str | None = None,
        clock: Clock = utcnow,
    ):
        self.slurm = slurm
        self.settings = settings
        self.sent = sent
        self.sources = list(sources)
        self.job_id = job_id
        self.clock = clock
        self.ctx = Context(slurm, sent, state_dir, emit, save=self._save, clock=clock)
        self._queries = 0
        self._source_failures: dict[str, int] = {}
        self._last_answer: dict[str, list[Drain]] = {}
        self._save_failed = False

    # ------------------------------------------------------------------------------------ one round

    def poll_once(self) -> PollResult:
        """One round. Raises SlurmError when the controller cannot be read (the loop backs off)."""
        self._queries = 0
        self.ctx.counts = {}
        if self.sent.path is not None and not self.sent.path.exists():
            self.ctx.dirty = True  # write it once at start: shows the watcher runs and can save
        now = self.clock()
        result = self._poll_job(self.job_id, now) if self.job_id else self._poll_cluster(now)
        self._save()
        result.queries = self._queries
        result.actions = dict(self.ctx.counts)
        result.draining = sorted(self.sent.events)
        return result

    def _poll_cluster(self, now: datetime) -> PollResult:
        result = PollResult()
        # Only drained and down nodes: `sinfo -N` of all 10,000 nodes costs ~2.4 s of CPU, of these ~0.06 s.
        nodes = self._nodes(states=NODE_STATES)
        drains = slurm_drains(nodes, self.settings.rules, self.settings.grace, now) + self._source_drains()
        result.new_events = self._update_events(drains, None, now)
        due = [e for e in self.sent.events.values() if not e.handled]
        enforcing = [e for e in self.sent.events.values() if self._enforcing(e, now)]
        if due or enforcing:
            names = sorted({e.node for e in due + enforcing})
            self._act_on_nodes(self._jobs(nodes=names, states=RUNNING_STATES), due, enforcing)
        if self.settings.fast_restart or self.settings.fallback:
            pending = self._jobs(states=launchhold.PENDING_STATES)
            for job in pending:
                if not launchhold.handle(self.ctx, job, self.settings.fallback):
                    restart(self.ctx, job, self.settings.fast_restart, self.settings.fallback, now)
                self._save()
            self.sent.forget_jobs({j.job_id for j in pending})
        return result

    def _poll_job(self, job_id: str, now: datetime) -> PollResult:
        result = PollResult()
        job = next((j for j in self._jobs(job_ids=[job_id]) if j.job_id == job_id), None)
        if job is None or job.state not in ALIVE_STATES:
            result.job_ended = True
            return result
        nodes = self._nodes(names=job.nodes) if job.nodes else []
        drains = slurm_drains(nodes, self.settings.rules, self.settings.grace, now) + self._source_drains()
        result.new_events = self._update_events(drains, set(job.nodes), now)
        due = [e for e in self.sent.events.values() if not e.handled]
        enforcing = [e for e in self.sent.events.values() if self._enforcing(e, now)]
        self._act_on_nodes([job], due, enforcing)
        return result

    # ------------------------------------------------------------------------------------ queries

    def _nodes(self, **query: Any) -> list[Node]:
        self._queries += 1
        return self.slurm.nodes(**query)

    def _jobs(self, **query: Any) -> list[Job]:
        self._queries += 1
        return self.slurm.jobs(**query)

    # ------------------------------------------------------------------------------------ helpers

    def _update_events(self, drains: list[Drain], scope: set[str] | None, now: datetime) -> list[str]:
        """Start events for nodes newly going away; end those of nodes back in service. The first
        drain time seen is kept (a later DOWN overwrites Slurm's reason time)."""
        earliest: dict[str, Drain] = {}
        for drain in drains:
            if scope is not None and drain.node not in scope:
                continue
            if drain.node not in earliest or drain.drain_time < earliest[drain.node].drain_time:
                earliest[drain.node] = drain
        for node in [n for n in self.sent.events if self._over(n, earliest, now)]:
            log.info("node %s: no longer draining or drained anew; its event is over", node)
            self.sent.forget_node(node)
            self.ctx.dirty = True
        new = sorted(n for n in earliest if n not in self.sent.events)
        for node in new:
            d = earliest[node]
            self.sent.events[node] = NodeEvent(node, d.drain_time, d.reason, d.source, d.grace)
            self.ctx.dirty = True
            log.info("node %s: going away (%s: %r at %s)", node, d.source, d.reason, to_text(d.drain_time))
            self.ctx.emit({"event": "drain_seen", "node": node, "source": d.source, "reason": d.reason,
                           "drain_time": to_text(d.drain_time), "grace": d.grace})  # fmt: skip
        return new

    def _over(self, node: str, current: dict[str, Drain], now: datetime) -> bool:
        """Slurm events end when Slurm stops reporting the drain; provider events end only once their
        deadline is past (an API that fails or forgets an event must not make it be told twice)."""
        if node in current:
            return self._redrained(current[node])
        known = self.sent.events[node]
        if known.source == "slurm":
            return True
        return now > deadline(known.drain_time, known.grace) + PROVIDER_EVENT_LINGER

    def _redrained(self, drain: Drain) -> bool:
        """A drain time other than the one remembered, on a node not DOWN: the node was resumed and
        drained again while we were not looking (a DOWN overwrites the time of the same event)."""
        known = self.sent.events[drain.node]
        return drain.source == known.source and drain.drain_time != known.drain_time and not drain.down

    def _enforcing(self, event: NodeEvent, now: datetime) -> bool:
        return self.settings.enforce and enforce_due(event, self.settings.enforce_margin, now)

    def _act_on_nodes(self, jobs: list[Job], due: list[NodeEvent], enforcing: list[NodeEvent]) -> None:
        failed: set[str] = set()
        due_nodes = {e.node: e for e in due}
        # A job on several draining nodes is told once, with the earliest deadline of them.
        mine = {
            j.job_id: sorted((due_nodes[n] for n in j.nodes if n in due_nodes), key=_deadline) for j in jobs
        }
        pairs = [(job, mine[job.job_id][0]) for job in jobs if mine[job.job_id]]
        retry = tell_many(self.ctx, pairs)
        for job, first in pairs:
            if job.job_id in retry:
                failed.update(e.node for e in mine[job.job_id])
                continue
            for other in mine[job.job_id][1:]:
                self._mark_told(job.job_id, other, first)
        self._save()
        for event in due:
            event.handled = event.node not in failed
        for event in enforcing:
            for job in jobs:
                if event.node in job.nodes:
                    enforce(self.ctx, job, event)
            event.enforced = True
        self.ctx.dirty = True

    def _mark_told(self, job_id: str, event: NodeEvent, told_with: NodeEvent) -> None:
        moment = self.clock()
        told = f"{told_with.node}@{to_text(told_with.drain_time)}"
        for what in ("notice", "signal"):
            self.sent.mark(job_id, event.node, what, moment, told)
        self.ctx.dirty = True

    def _source_drains(self) -> list[Drain]:
        found: list[Drain] = []
        for source in self.sources:
            try:
                self._last_answer[source.name] = source.fetch()
                self._source_failures[source.name] = 0
            except SourceError as exc:
                count = self._source_failures.get(source.name, 0) + 1
                self._source_failures[source.name] = count
                if count == 1 or count % 60 == 0:  # log the first failure, then now and then
                    log.warning("source %s: %s (failure %d; carrying on)", source.name, exc, count)
            found += self._last_answer.get(source.name, [])  # a failed read keeps the last good answer
        return found

    def _save(self) -> None:
        if not self.ctx.dirty:
            return
        try:
            self.sent.save()
            self.ctx.dirty = False
            self._save_failed = False
        except OSError as exc:
            if not self._save_failed:  # once per failure spell, not on every poll
                log.warning("cannot save the watcher state to %s: %s (kept in memory)", self.sent.path, exc)
            self._save_failed = True


def _deadline(event: NodeEvent) -> datetime:
    return deadline(event.drain_time, event.grace)


# ---------------------------------------------------------------------------------------- loop


def run(
    watcher: Watcher,
    stop: threading.Event | None = None,
    once: bool = False,
    on_poll: Emit = lambda _r: None,
) -> int:
    """Poll every ``interval`` seconds until ``stop`` is set (or, for a sidecar, the job ends).
    A failing controller is retried with exponential back-off up to ``max_backoff``; never raises
    except in ``once`` mode, where the error reaches the caller."""
    stop = stop or threading.Event()
    settings = watcher.settings
    failures = 0
    while True:
        began = time.monotonic()
        result: PollResult | None = None
        try:
            result = watcher.poll_once()
            failures = 0
            on_poll(result.to_json())
        except SlurmError as exc:
            if once:
                raise
            failures += 1
            log.warning("Slurm did not answer (%s); retry %d", exc, failures)
        except Exception as exc:  # a bug must not become a crash loop under systemd
            if once:
                raise
            failures += 1
            log.error("unexpected %s: %s; carrying on", type(exc).__name__, exc)
            log.debug("traceback of the unexpected %s", type(exc).__name__, exc_info=True)
        if once or (result is not None and result.job_ended):
            return 0
        wait = (
            settings.interval if failures == 0 else min(settings.max_backoff, settings.interval * 2**failures)
        )
        if stop.wait(max(0.0, wait - (time.monotonic() - began))):
            return 0


def state_path(state_dir: Path, job_id: str | None) -> Path:
    """The daemon's sent-state, or a sidecar's per-job one."""
    name = f"sidecar-{job_id}.json" if job_id else "sent.json"
    return Path(state_dir) / "watcher" / name


def load_sent(path: Path) -> SentState:
    """The saved state; a corrupt file is moved aside (logged) rather than stopping the watcher."""
    try:
        return sentstate.load(path)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        aside = path.with_suffix(".corrupt")
        log.warning("watcher state %s unreadable (%s); moved to %s, starting afresh", path, exc, aside)
        try:
            path.replace(aside)
        except OSError:
            pass
        return SentState(path=path)
