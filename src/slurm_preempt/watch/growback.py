"""Grow-back: tell a job running below its MAX nodes to requeue, so that it comes back larger.

A ``--nodes=MIN-MAX`` job that shrank (``job/shrink.py``), or started on fewer nodes than MAX, runs
below MAX for ever: Slurm never adds nodes to a running job. When the provider has refilled its
capacity (idle nodes that match the job's constraint and partition), a job that opted in
(``slurm-preempt:grow-back=SECONDS``, and the watcher's ``grow_back = true``) is told, through the
notice path as for a drain (a notice with source ``grow-back``, then its signal): its program takes its
final checkpoint and its batch script requeues it (the script does not shrink on such a notice: no node
leaves). The watcher then releases Slurm's requeue hold at once (``grown_back``) and Slurm starts the
next attempt on up to MAX nodes.

Slurm facts (tried on 22.05 here, with ``squeue -O NumNodes,MaxNodes``):

- squeue's MaxNodes of a running job is the count it holds, not the MAX it asked for (a 2-3 job on 2
  nodes shows 2 and 2; after a shrink 3 -> 2 too; so does the requeued job while pending). So MAX comes
  from the job's own comment (``slurm-preempt:max-nodes=N``, which ``slurm-preempt sbatch`` writes
  from ``--nodes``): a user's figure that can only make their own job be told, once per window.
- Slurm keeps the requested range through a shrink and a requeue: a 2-3 job shrunk to 2 (or started on
  2), requeued and released with ``starttime=now``, ran on 3 nodes when 3 were idle.

``decide`` is pure (a job, what it asked for, the idle nodes, when it last grew, a clock); ``Grower``
asks Slurm and acts. Each grow-back is recorded in the ledger (``grow_back``, root's) before the
signal, and that record is the window's memory: it outlives a watcher restart.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from slurm_preempt import ids, ledger, optin
from slurm_preempt.errors import SlurmError
from slurm_preempt.notice import GROW_BACK_SOURCE, Notice, notice_path, to_text, write_notice
from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.slurm.priority import Queued, outranked_by
from slurm_preempt.watch.actions import Context
from slurm_preempt.watch.deadline import event_time
from slurm_preempt.watch.sentstate import SentState

log = logging.getLogger(__name__)

SOURCE = GROW_BACK_SOURCE  # a notice's source: the job script requeues, never shrinks (job/shrink.py)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Decision:
    """Grow to ``target`` nodes (``idle`` are the nodes that make it possible), or why not."""

    why_not: str = ""
    target: int = 0
    idle: tuple[str, ...] = ()

    @property
    def grow(self) -> bool:
        return not self.why_not


def matches(constraint: str, features: Collection[str]) -> bool | None:
    """Whether a node with ``features`` satisfies the job's ``--constraint``: feature names joined by
    ``&`` (all) or by ``|`` (any). None for anything richer (counts, brackets, both operators): not
    judged, so the job is never told on a guess."""
    text = (constraint or "").strip()
    if not text:
        return True
    if "&" in text and "|" in text:
        return None
    words = text.split("&") if "&" in text else text.split("|")
    if not all(_NAME.fullmatch(w) for w in words):
        return None
    found = [w in features for w in words]
    return all(found) if "&" in text else any(found)


def idle_for(job: Job, nodes: Iterable[Node]) -> tuple[str, ...]:
    """The idle nodes, not the job's own, that its constraint matches (None: not judged: none)."""
    return tuple(
        n.name
        for n in nodes
        if n.state == "IDLE" and n.available and n.name not in job.nodes and matches(job.features, n.features)
    )


def window_of(wish: optin.OptIn, least: float) -> float:
    """The job's window: what it asked for, never below the watcher's ``grow_back_min_window``."""
    return max(float(wish.grow_back or 0), least)


def decide(
    job: Job,
    wish: optin.OptIn,
    idle: Sequence[str],
    last_grow: datetime | None,
    now: datetime,
    *,
    window: float,
    busy: str = "",
) -> Decision:
    """Whether to tell ``job`` to grow back now. ``busy`` says why the watcher must leave the job alone
    (a notice open for it, a node of it draining): then never."""
    if not job.running or wish.grow_back is None or not wish.signal:
        return Decision("not opted in to grow-back (with a signal), or not running")
    if wish.max_nodes is None or job.num_nodes >= wish.max_nodes:
        return Decision(f"runs on {job.num_nodes} of at most {wish.max_nodes or job.num_nodes} nodes")
    if busy:
        return Decision(busy)
    if wish.fallback_after and job.restart_count + 1 >= wish.fallback_after:
        return Decision(f"a requeue now would move it to {wish.fallback_to} (fallback-after)")
    if not idle:
        return Decision("no idle node matches its constraint and partition")
    since = max((t for t in (last_grow, job.start_time) if t is not None), default=None)
    if since is not None and now < since + timedelta(seconds=window):
        return Decision(f"within its window of {window:g} s (since {to_text(since)})")
    target = min(wish.max_nodes, job.num_nodes + len(idle))
    return Decision(target=target, idle=tuple(idle[: target - job.num_nodes]))


def busy(sent: SentState, job: Job, drained: Collection[str]) -> str:
    """Why the watcher leaves this job alone now: a notice open for it (a drain in progress), or a
    node of it drained, draining or down (``drained``: this poll's ``sinfo -t drain,down``)."""
    if sent.telling(job.job_id, job.restart_count, job.nodes) is not None:
        return "a notice is open for it"
    gone = sorted(n for n in job.nodes if n in drained or n in sent.events)
    return f"its node(s) {', '.join(gone)} drain or are down" if gone else ""


def held_back(job: Job, queue: list[Queued]) -> str:
    """Why a job that may grow back is not told now because of the others in its partition: once
    requeued it competes again for the nodes it frees, and a pending job of a higher (or equal)
    priority would take them, leaving it pending where it ran. "" when none outranks it."""
    own, rival = outranked_by(job.job_id, queue)
    if own is None:
        return f"its priority is not known (squeue -p {job.partition} did not list it)"
    if rival is None:
        return ""
    return (
        f"pending job {rival.job_id} (priority {rival.priority}, at least its own {own.priority}) in"
        f" partition {job.partition} could take the nodes it would free"
    )


def refused_tokens(comment: str) -> list[str]:
    """Grow-back tokens present in a comment whose value was refused (bad numbers, huge values)."""
    wish = optin.parse(comment)
    asked = dict(optin.tokens(comment))
    bad = []
    if "grow-back" in asked and wish.grow_back is None:
        bad.append(f"grow-back={ids.shorten(asked['grow-back'], 20)}")  # user text: escaped
    if "max-nodes" in asked and wish.max_nodes is None:
        bad.append(f"max-nodes={ids.shorten(asked['max-nodes'], 20)}")
    return bad


# ---------------------------------------------------------------------------------------- records


def last_grow(ctx: Context, job: Job) -> datetime | None:
    """When a watcher last told this job to grow back (its ``grow_back`` records), if ever.
    (``actions.restart`` releases the requeued job at once when that record is of its last attempt.)"""
    if ctx.state_dir is None:
        return None
    try:
        found = ledger.trusted_events(ctx.state_dir, job.job_id)
    except (OSError, ValueError) as exc:
        log.warning("job %s: ledger unreadable, no grow-back: %s", job.job_id, exc)
        return datetime.max.replace(tzinfo=ctx.clock().tzinfo)  # unknown: as if it just grew
    # Root's records (the daemon's), or a user watcher's own in its user's folder: a user who forges or
    # deletes one there only changes when their own job may be told again.
    times = [event_time(e.get("time")) for e in found if e["kind"] == "grow_back"]
    return max((t for t in times if t is not None), default=None)


# ---------------------------------------------------------------------------------------- acting


def tell(ctx: Context, job: Job, decision: Decision, grace: float) -> bool:
    """Record ``grow_back``, write the notice, send the job's signal. False when it failed (the record
    is taken back: the next look tries again)."""
    wish = optin.parse(job.comment)
    assert wish.signal is not None and ctx.state_dir is not None
    now = ctx.clock()
    host = job.nodes[0] if job.nodes else ""
    reason = f"grow-back: {len(decision.idle)} idle node(s), {job.num_nodes} -> {decision.target} nodes"
    notice = Notice.for_drain(job.job_id, host, reason, SOURCE, now, grace, now, job.restart_count)
    fields = {
        "reason": reason,
        "event_id": notice.event_id,
        "restart_count": job.restart_count,
        "num_nodes_before": job.num_nodes,
        "nodes": decision.target,
        "idle": len(decision.idle),
        "idle_nodes": ",".join(decision.idle),
        "deadline": to_text(notice.deadline),
    }
    try:
        with ctx.recorded("grow_back", job.job_id, **fields):
            write_notice(notice_path(ctx.state_dir, job.job_id), notice)
            failed = ctx.slurm.signal_many([job.display_id], wish.signal, batch_only=True)
            if failed.strip():
                raise SlurmError(["scancel"], None, failed.strip())
    except (OSError, ValueError, SlurmError) as exc:
        log.warning("job %s: grow-back not told, will retry: %s", job.job_id, exc)
        return False
    log.info("job %s: %s: told to requeue (SIG%s)", job.job_id, reason, wish.signal)
    return True


# ---------------------------------------------------------------------------------------- polling

NodesQuery = Callable[..., list[Node]]
JobsQuery = Callable[..., list[Job]]


class Grower:
    """The cluster watcher's grow-back: a look every ``every`` seconds. Queries per look: one
    ``sinfo -N -t idle``; only when a node is idle, one ``squeue -t running``; only when a running job
    asked for grow-back and holds fewer nodes than its MAX, one ``sinfo -t idle -p P`` per partition of
    such jobs, and its ledger; only when such a job may grow, one ``squeue -p P`` of its partition's
    priorities (``held_back``)."""

    def __init__(self, every: float, min_window: float, grace: float) -> None:
        self.every, self.min_window, self.grace = every, min_window, grace
        self._next: datetime | None = None
        self._warned: set[str] = set()  # jobs whose refused tokens were logged (those running now)
        self._held: dict[str, str] = {}  # job -> why it was last held back (logged once per reason)

    def due(self, now: datetime) -> bool:
        return self._next is None or now >= self._next

    def look(self, ctx: Context, nodes: NodesQuery, jobs: JobsQuery, drained: Collection[str]) -> int:
        """Tell the jobs that may grow back now; return how many were told. ``drained``: the nodes this
        poll found drained, draining or down."""
        now = ctx.clock()
        self._next = now + timedelta(seconds=self.every)
        if ctx.state_dir is None or not any(n.available for n in nodes(states="idle")):
            return 0
        running = jobs(states="running")
        self._warned &= {j.job_id for j in running}
        wanting = [j for j in running if self._wants(j)]
        self._held = {k: v for k, v in self._held.items() if k in {j.job_id for j in wanting}}
        pools: dict[str, list[Node]] = {}
        queues: dict[str, list[Queued]] = {}
        told = 0
        for job in wanting:
            if job.partition not in pools:
                plain = _NAME.fullmatch(job.partition) is not None  # one partition, a name
                pools[job.partition] = nodes(states="idle", partition=job.partition) if plain else []
            decision = self._consider(ctx, job, pools[job.partition], busy(ctx.sent, job, drained), now)
            if not decision.grow or self._held_back(ctx, job, queues):
                continue
            if tell(ctx, job, decision, self.grace):
                pools[job.partition][:] = [n for n in pools[job.partition] if n.name not in decision.idle]
                told += 1  # those nodes are not promised to a second job
        return told

    def _held_back(self, ctx: Context, job: Job, queues: dict[str, list[Queued]]) -> bool:
        """Whether a pending job of its partition outranks it (or that cannot be told): then not now."""
        if job.partition not in queues:
            try:
                queues[job.partition] = ctx.slurm.queue(job.partition)
            except SlurmError as exc:
                log.warning("job %s: no grow-back this look, partition %s's queue unread: %s",
                            job.job_id, job.partition, exc)  # fmt: skip
                queues[job.partition] = []
        why = held_back(job, queues[job.partition])
        if why and self._held.get(job.job_id) != why:
            log.info("job %s: no grow-back while %s", job.job_id, why)
        self._held[job.job_id] = why
        return bool(why)

    def _wants(self, job: Job) -> bool:
        bad = refused_tokens(job.comment)
        if bad and job.job_id not in self._warned:
            self._warned.add(job.job_id)
            log.warning("job %s: grow-back token(s) ignored: %s", job.job_id, ", ".join(bad))
        wish = optin.parse(job.comment)
        return wish.grow_back is not None and wish.max_nodes is not None and job.num_nodes < wish.max_nodes

    def _consider(self, ctx: Context, job: Job, pool: list[Node], busy: str, now: datetime) -> Decision:
        wish = optin.parse(job.comment)
        window = window_of(wish, self.min_window)
        idle = idle_for(job, pool)
        first = decide(job, wish, idle, None, now, window=window, busy=busy)
        if not first.grow:
            log.debug("job %s: no grow-back: %s", job.job_id, first.why_not)
            return first
        return decide(job, wish, idle, last_grow(ctx, job), now, window=window, busy=busy)
