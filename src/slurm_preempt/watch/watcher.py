"""The drain watcher: notice draining preemptible nodes, tell their jobs, restart requeued jobs fast.

``Watcher.poll_once()`` does one round and returns what it did; ``watch.loop.run()`` is the loop around
it (interval, back-off, crash semantics, systemd). Three modes:

Cluster daemon (``job_id`` and ``user`` None), and a user's own watcher (``user`` set: only that user's
jobs, with nothing but the rights of a job's owner). Slurm queries per poll, whatever the number of
nodes:

1. ``sinfo -N -t drain,down`` (every drained or down node, with reason and time), always;
2. ``squeue -w <nodes> -t running,configuring`` only when a node newly started draining (or an
   earlier round on it failed, or its enforcement moment came): one call for all such nodes;
3. ``squeue -t pending`` when fast restart or fallback is on, for the requeued opted-in jobs (and
   those a failed launch holds: ``launchhold``).

4. ``sinfo -N`` of every node, for the pools' sizes behind the live preemption rate (``watch.rate``),
   only in a poll that opened drain events, at most every ``rate_pool_refresh`` seconds.

5. with ``grow_back`` on, every ``grow_back_every`` seconds: ``sinfo -N -t idle``, and only when a node is
   idle ``squeue -t running`` (then ``sinfo -t idle -p P`` per partition of jobs below their MAX:
   ``watch.growback``).

So at most 4 queries (3 but for the rate's; a grow-back look adds its own), plus the actions: one
``scancel --signal`` per batch of jobs told (a few batches side by side) and one ``scontrol update`` per
job restarted or moved.
Nothing kept from one poll to the next grows with the number of polls: only what is open now
(``SentState``).

Sidecar (``job_id`` set, run by the job itself): ``squeue -j J`` then ``sinfo -n <J's nodes>``; it tells
only its own job and ends when the job stops running.

Several watchers may share one state file (a pair on two hosts; a restarted one): a ``Lease`` decides
which one acts; the other stands by, polling nothing but the lease.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_preempt import ids, optin
from slurm_preempt.notice import deadline, event_id, utcnow
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.watch import events, growback, launchhold, sentstate
from slurm_preempt.watch.actions import Clock, Context, Emit, LostLease, enforce, enforce_due, restart
from slurm_preempt.watch.lease import Lease
from slurm_preempt.watch.outbox import Outbox
from slurm_preempt.watch.rate import RatePublisher
from slurm_preempt.watch.sentstate import NodeEvent, SentState
from slurm_preempt.watch.sources import Drain, Source, SourceError, slurm_drains
from slurm_preempt.watch.tell import confirm, tell_many

if TYPE_CHECKING:
    from slurm_preempt.watch.settings import Settings

log = logging.getLogger(__name__)

NODE_STATES = "drain,down"  # sinfo -t: DRAIN covers DRAINING and DRAINED
RUNNING_STATES = "running,configuring"  # squeue -t: the jobs still on a node
ALIVE_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED"}


@dataclass
class PollResult:
    queries: int = 0  # sinfo/squeue calls made
    draining: list[str] = field(default_factory=list)  # nodes in a drain event
    new_events: list[str] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    job_ended: bool = False  # sidecar: its job stopped running
    standby: bool = False  # another watcher holds the lease: nothing was asked or done

    def to_json(self) -> dict[str, Any]:
        return {
            "event": "poll",
            "queries": self.queries,
            "draining": self.draining,
            "new_events": self.new_events,
            "actions": self.actions,
            "job_ended": self.job_ended,
            "standby": self.standby,
        }


class Watcher:
    """One watcher: its Slurm (anything with the calls of ``WatcherSlurm``), settings, saved state and
    extra sources. ``clock`` gives the present moment (tests inject one; nothing here sleeps).
    ``lease`` None: the only watcher of its state. ``detached``: signals sent by helper processes that
    outlive this one (``watch.outbox``). ``on_beat`` is called between Slurm calls (systemd's watchdog)."""

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
        user: str | None = None,
        lease: Lease | None = None,
        detached: bool = False,
        on_beat: Callable[[], None] = lambda: None,
    ):
        self.slurm = slurm
        self.settings = settings
        self.sent = sent
        self.sources = list(sources)
        self.job_id = job_id
        self.user = user
        self.clock = clock
        self.lease = lease
        self.on_beat = on_beat
        self.ctx = Context(slurm, sent, state_dir, emit, clock=clock, may_act=self._may_act, save=self._save)
        # A sidecar ends with its job (which Slurm kills with everything it started): no outbox on disk.
        folder = Path(f"{sent.path}.outbox") if sent.path is not None and job_id is None else None
        self.outbox = Outbox(folder, slurm, detached, settings.slurm_timeout, beat=self.beat)
        self._holding = lease is None
        self._queries = 0
        self._source_failures: dict[str, int] = {}
        self._last_answer: dict[str, list[Drain]] = {}
        self._young_since: dict[str, datetime] = {}  # jobs whose signal waits: since when (our clock)
        self._save_failed = False
        self.rate = _rate_publisher(settings, state_dir, clock()) if job_id is None and user is None else None
        windows = (settings.grow_back_every, settings.grow_back_min_window, settings.grace)
        self.grower = growback.Grower(*windows) if settings.grow_back and job_id is None else None

    # ------------------------------------------------------------------------------------ one round

    def poll_once(self) -> PollResult:
        """One round. Raises SlurmError when the controller cannot be read (the loop backs off)."""
        self._queries = 0
        self.ctx.counts = {}
        if not self._hold():
            return PollResult(standby=True)
        now = self.clock()
        try:
            in_flight = self._leftovers()
            result = self._poll_job(self.job_id, now) if self.job_id else self._poll_cluster(now, in_flight)
        except LostLease:
            log.warning(
                "%s took over the lease mid-poll; standing by", self.lease.holder() if self.lease else "?"
            )
            self._holding = False
            result = PollResult(standby=True)
        self._save()
        result.queries = self._queries
        result.actions = dict(self.ctx.counts)
        result.draining = sorted(self.sent.events)
        return result

    def beat(self) -> None:
        """Between Slurm calls and while waiting: renew the lease, ping systemd's watchdog."""
        if self.lease is not None:
            self.lease.renew()
        self.on_beat()

    def beat_every(self) -> float | None:
        """How often the loop must beat while it waits (None: no need)."""
        return self.lease.ttl / 4 if self.lease is not None else None

    def release(self) -> None:
        """A clean stop: a standby may take over at once."""
        self.outbox.close()
        if self.lease is not None:
            self.lease.release()

    def _poll_cluster(self, now: datetime, in_flight: set[str]) -> PollResult:
        result = PollResult()
        # Only drained and down nodes: `sinfo -N` of all 10,000 nodes costs ~2.4 s of CPU, of these ~0.06 s.
        nodes = self._nodes(states=NODE_STATES)
        drains = slurm_drains(nodes, self.settings.rules, self.settings.grace, now) + self._source_drains()
        result.new_events = self._update_events(drains, None, now)
        if self.rate is not None:
            self.rate.after_poll(self._nodes, nodes, result.new_events, now)
        due = [e for e in self.sent.events.values() if not e.handled]
        enforcing = [e for e in self.sent.events.values() if self._enforcing(e, now)]
        if due or enforcing:
            names = sorted({e.node for e in due + enforcing})
            jobs = self._jobs(nodes=names, states=RUNNING_STATES)
            self._act_on_nodes(jobs, due, enforcing, in_flight)
        if self.grower is not None and self.grower.due(now):
            self.grower.look(self.ctx, self._nodes, self._jobs, {n.name for n in nodes})
        if self.settings.fast_restart or self.settings.fallback:
            pending = self._jobs(states=launchhold.PENDING_STATES)
            for job in pending:
                if not launchhold.handle(self.ctx, job, self.settings.fallback):
                    restart(self.ctx, job, self.settings.fast_restart, self.settings.fallback, now)
                self.beat()
            self._save()
            self.sent.forget_jobs({j.job_id for j in pending})
            self.sent.forget_released(now)
        self._acknowledge()
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
        self._act_on_nodes([job], due, enforcing, set())
        self._acknowledge()
        return result

    # ------------------------------------------------------------------------------------ queries

    def _nodes(self, **query: Any) -> list[Node]:
        self._queries += 1
        self.beat()
        return self.slurm.nodes(**query)

    def _jobs(self, **query: Any) -> list[Job]:
        self._queries += 1
        self.beat()
        if self.user is not None and "job_ids" not in query:
            query["user"] = self.user
        return self.slurm.jobs(**query)

    # ------------------------------------------------------------------------------------ the lease

    def _hold(self) -> bool:
        if self.lease is None:
            return True
        holding = self.lease.hold()
        if holding and not self._holding:
            # Taken over (or back): what the other watcher did is in the shared state and outbox,
            # loaded as at start (a file of another uid is not believed, a corrupt one set aside).
            self.sent = load_sent(self.sent.path) if self.sent.path else self.sent
            self.ctx.sent = self.sent
        self._holding = holding
        return holding

    def _may_act(self) -> bool:
        return self.lease is None or self.lease.still_mine()

    def _leftovers(self) -> set[str]:
        """Signals an earlier watcher (or a slow helper) left in the outbox: confirm them; a failed one
        reopens its node's event, so its jobs are asked for and told again."""
        finished, in_flight = self.outbox.leftovers()
        for item in confirm(self.ctx, finished, {}):
            self.sent.set_handled(item.node, False)
        self.outbox.finish(finished)
        return in_flight

    # ------------------------------------------------------------------------------------ helpers

    def _update_events(self, drains: list[Drain], scope: set[str] | None, now: datetime) -> list[str]:
        return events.update(self.sent, drains, scope, now, self.ctx.emit)

    def _enforcing(self, event: NodeEvent, now: datetime) -> bool:
        return self.settings.enforce and enforce_due(event, self.settings.enforce_margin, now)

    def _act_on_nodes(
        self, jobs: list[Job], due: list[NodeEvent], enforcing: list[NodeEvent], in_flight: set[str]
    ) -> None:
        due_nodes = {e.node: e for e in due}
        mine = {
            j.job_id: sorted((due_nodes[n] for n in j.nodes if n in due_nodes), key=_deadline) for j in jobs
        }
        pairs = []
        for job in jobs:
            pairs += self._what_to_tell(job, mine[job.job_id])
        young = {job.job_id for job, _event, may_signal in pairs if may_signal and self._too_young(job)}
        self._young_since = {j: t for j, t in self._young_since.items() if j in young}
        pairs = [(job, event, may_signal and job.job_id not in young) for job, event, may_signal in pairs]
        failed: set[str] = set()
        if pairs:
            retry = tell_many(self.ctx, self.outbox, pairs, in_flight) | young  # signalled on a later poll
            failed = {e.node for job in jobs if job.job_id in retry for e in mine[job.job_id]}
        for event in due:
            self.sent.set_handled(event.node, event.node not in failed)
        self._save()
        self._enforce(jobs, enforcing)

    def _what_to_tell(self, job: Job, new: list[NodeEvent]) -> list[tuple[Job, NodeEvent, bool]]:
        """A job is told once per attempt while an event it was told of is open: with the earliest
        deadline of its nodes' events. A later drain of another of its nodes never postpones that
        deadline; one with an earlier deadline rewrites the notice, without a second signal."""
        if not new:
            return []
        first, rest = new[0], new[1:]
        told = self.sent.telling(job.job_id, job.restart_count, job.nodes)
        if told is not None and told.event_id == _event_id(first):
            told = None  # the same event, something of it to retry: tell_many skips what was done
        if told is not None and _deadline(first) >= told.deadline:
            for event in new:  # already told, as early or earlier: nothing to say
                self._mark_told(job, event, told.event_id, told.deadline, ("notice", "signal"))
            return []
        for event in rest:
            self._mark_told(job, event, _event_id(first), _deadline(first), ("notice", "signal"))
        if told is None:
            return [(job, first, True)]
        # Told already in this attempt, but this deadline is earlier: a new notice, no second signal.
        self._mark_told(job, first, _event_id(first), _deadline(first), ("signal",))
        return [(job, first, False)]

    def _too_young(self, job: Job) -> bool:
        """Started less than ``signal_after_start`` ago: its batch script may not trap the signal yet
        (a USR1 34 ms after the allocation killed bash, and the job ended COMPLETED, never requeued).
        Its notice is written now; its node stays open, so the next poll asks again and signals it."""
        if job.start_time is None or not optin.parse(job.comment).signal:
            return False
        now, margin = self.clock(), self.settings.signal_after_start
        # StartTime is the controller's clock: one far behind ours would hold the signal back for good,
        # so it waits at most `margin` of our own clock too.
        since = self._young_since.setdefault(job.job_id, now)
        age = (now - job.start_time).total_seconds()
        if age >= margin or (now - since).total_seconds() >= margin:
            return False
        log.info("job %s started %.0f s ago: its signal waits for its script to set up", job.job_id, age)
        return True

    def _mark_told(
        self, job: Job, event: NodeEvent, told: str, when: datetime, acts: tuple[str, ...]
    ) -> None:
        for what in acts:
            self.sent.mark_told(job.job_id, event.node, what, self.clock(), told, job.restart_count, when)

    def _enforce(self, jobs: list[Job], enforcing: list[NodeEvent]) -> None:
        """Requeue each opted-in job still on an enforcing node once; an event is enforced when all of
        its jobs were (a failed requeue is retried on the next poll)."""
        outcome: dict[str, bool] = {}
        for event in enforcing:
            on_node = [j for j in jobs if event.node in j.nodes]
            for job in on_node:
                if job.job_id not in outcome and not self.sent.done(job.job_id, event.node, "enforced"):
                    outcome[job.job_id] = enforce(self.ctx, job, event)
                    self.beat()
            for job in on_node:
                if outcome.get(job.job_id, True):
                    self.sent.mark_told(job.job_id, event.node, "enforced", self.clock(), _event_id(event))
            self.sent.set_enforced(event.node, all(outcome.get(j.job_id, True) for j in on_node))
        self._save()

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

    def _acknowledge(self) -> None:
        """Sources that want to hear it (Azure's StartRequests) learn which nodes' jobs were all told."""
        told = {e.node for e in self.sent.events.values() if e.handled}
        for source in self.sources:
            acknowledge = getattr(source, "told", None)
            if told and acknowledge is not None:
                acknowledge(told)

    def _save(self) -> None:
        """Write the state when it changed (the state says). A failed write is logged once per spell
        of failures; the state stays changed, so the next save tries again."""
        if not self.sent.changed:
            return
        try:
            self.sent.save()
            self._save_failed = False
        except OSError as exc:
            if not self._save_failed:  # once per failure spell, not on every poll
                log.warning("cannot save the watcher state to %s: %s (kept in memory)", self.sent.path, exc)
            self._save_failed = True


def _rate_publisher(settings: Settings, state_dir: Path | None, now: datetime) -> RatePublisher | None:
    """The cluster daemon's live preemption rate (``watch.rate``), published under its state folder."""
    if state_dir is None:
        return None
    windows = (settings.rate_window, settings.rate_jump_window, settings.rate_pool_refresh)
    return RatePublisher(state_dir, *windows, now)


def _deadline(event: NodeEvent) -> datetime:
    return deadline(event.drain_time, event.grace)


def _event_id(event: NodeEvent) -> str:
    return event_id(event.node, event.drain_time)


def state_path(state_dir: Path, job_id: str | None = None, user: str | None = None) -> Path:
    """The daemon's sent-state, a user watcher's, or a sidecar's per-job one. A sidecar keeps its own in
    its job's ledger folder, which the prolog gave to the job's user (a dot name: no ledger reader looks
    at it), so no user ever needs to write the watcher's folder, where root's state lives."""
    if job_id:
        return Path(state_dir) / "jobs" / ids.job_id(job_id) / ".sidecar-state.json"
    return Path(state_dir) / "watcher" / (f"user-{user}.json" if user else "sent.json")


def load_sent(path: Path) -> SentState:
    """The saved state; a corrupt file is moved aside (logged) rather than stopping the watcher. A file
    of another user is not believed (it could say every job was told)."""
    try:
        owner = path.lstat().st_uid if path.exists() else os.geteuid()
        if owner != os.geteuid():
            log.warning(
                "watcher state %s belongs to uid %d, not to us: ignored, starting afresh", path, owner
            )
            return SentState(path=path)
        return sentstate.load(path)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        aside = path.with_suffix(".corrupt")
        log.warning("watcher state %s unreadable (%s); moved to %s, starting afresh", path, exc, aside)
        try:
            path.replace(aside)
        except OSError:
            pass
        return SentState(path=path)
