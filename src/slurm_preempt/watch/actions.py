"""What the watcher does to jobs: tell them (notice + signal), enforce the deadline, restart them fast,
move them to standard nodes. Every action is recorded in the sent-state (so it is never repeated) and
in the ledger; failures are logged and retried on a later poll, never raised.

Only Slurm acts on jobs (``scancel --signal``, ``scontrol update/requeue``): no PID is ever signalled.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from slurm_preempt import ids, ledger, optin
from slurm_preempt.errors import JobGoneError, SlurmError
from slurm_preempt.notice import Notice, deadline, notice_path, to_text, utcnow, write_notice
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch.sentstate import NodeEvent, SentState

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], None]
Clock = Callable[[], datetime]


@dataclass
class Context:
    """Everything an action needs. ``state_dir`` None: no notice files and no ledger (signals only)."""

    slurm: WatcherSlurm
    sent: SentState
    state_dir: Path | None
    emit: Emit = lambda _e: None
    save: Callable[[], None] = lambda: None  # persists the sent-state when dirty
    clock: Clock = utcnow  # the watcher's clock (tests inject one)
    dirty: bool = False  # sent-state changed since the last save
    counts: dict[str, int] = field(default_factory=dict)

    def did(self, kind: str, job_id: str, **fields) -> None:
        """Save what was done, then count, emit a JSON event and write the ledger (a broken state
        folder is logged, not raised). Saving first: a watcher killed here must not redo the action."""
        self.save()
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.emit({"event": kind, "job_id": job_id, "time": to_text(self.clock()), **fields})
        if self.state_dir is None:
            return
        try:
            ledger.record(self.state_dir, job_id, kind, source="watcher", **fields)
        except (OSError, ValueError) as exc:
            log.warning("cannot write the ledger of job %s under %s: %s", job_id, self.state_dir, exc)


# ---------------------------------------------------------------------------------------- tell


def tell(ctx: Context, job: Job, event: NodeEvent) -> bool:
    """Notice file, then signal if the job opted in; each exactly once per job and node event.
    Returns False when something must be retried on the next poll."""
    return not tell_many(ctx, [(job, event)])


@dataclass
class _Delivery:
    """One job's notice and signal: planned, delivered, then recorded (in that order for all jobs)."""

    job: Job
    notice: Notice
    write: bool  # the notice file is still to be written
    signal: str | None  # the signal still to be sent
    wrote: str = ""  # the path written
    failure: str = ""  # why the notice could not be written
    signalled: str = ""  # "ok", "gone", or "" with signal_error set
    signal_error: str = ""


# scancel names each job it could not signal: "scancel: error: Kill job error on job id 12: <why>".
_SCANCEL_FAILED = re.compile(r"job id (\d+(?:_\d+)?)\S*:?\s*(.*)")
_GONE_WORDS = ("Invalid job id", "already finished", "already completing")


def tell_many(ctx: Context, pairs: list[tuple[Job, NodeEvent]]) -> set[str]:
    """Tell many jobs at once (a correlated preemption drains many nodes): every notice file first
    (written in worker threads), then one ``scancel`` per signal name for all the jobs. What was done
    is recorded as soon as it is done. Returns the ids of jobs to retry on the next poll."""
    plans = [p for p in (_plan(ctx, job, event) for job, event in pairs) if p.write or p.signal]
    retry: set[str] = set()
    if ctx.state_dir is not None and sum(p.write for p in plans) > 1:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda p: _write(ctx.state_dir, p), plans))
    else:
        for plan in plans:
            _write(ctx.state_dir, plan)
    for plan in plans:
        if not _record_notice(ctx, plan):
            retry.add(plan.job.job_id)
    signals = sorted({p.signal for p in plans if p.signal})
    chunks = [(sig, c) for sig in signals for c in _chunk([p for p in plans if p.signal == sig])]
    if len(chunks) > 1:
        # scancel signals its jobs one RPC after another: a few of them side by side go faster.
        with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
            list(pool.map(lambda chunk: _signal_group(ctx.slurm, *chunk), chunks))
    elif chunks:
        _signal_group(ctx.slurm, *chunks[0])
    for _sig, chunk in chunks:
        retry.update(p.job.job_id for p in chunk if not _record_signal(ctx, p))
    return retry


def _chunk(plans: list[_Delivery], parts: int = 4, least: int = 8) -> list[list[_Delivery]]:
    size = max(least, -(-len(plans) // parts))
    return [plans[i : i + size] for i in range(0, len(plans), size)]


def _plan(ctx: Context, job: Job, event: NodeEvent) -> _Delivery:
    wish = optin.parse(job.comment)
    notice = Notice.for_drain(
        job.job_id, event.node, event.reason, event.source, event.drain_time, event.grace, ctx.clock()
    )
    write = not _already(ctx, job.job_id, notice, "notice")
    signal = wish.signal if wish.signal and not _already(ctx, job.job_id, notice, "signal") else None
    return _Delivery(job, notice, write, signal)


def _already(ctx: Context, job_id: str, notice: Notice, what: str) -> bool:
    """Done by us (sent-state), or by another watcher (a job's sidecar next to the daemon, or a daemon
    whose state was lost): the shared ledger says so."""
    if ctx.sent.done(job_id, notice.node, what):
        return True
    if ctx.state_dir is None:
        return False
    try:
        found = ledger.events(ctx.state_dir, job_id)
    except (OSError, ValueError):
        return False
    kind = f"{what}_sent"
    if any(e.get("kind") == kind and e.get("event_id") == notice.event_id for e in found):
        ctx.sent.mark(job_id, notice.node, what, ctx.clock(), notice.event_id)
        ctx.dirty = True
        return True
    return False


def _write(state_dir: Path | None, plan: _Delivery) -> None:
    """Runs in a worker thread: file I/O only."""
    if not plan.write or state_dir is None:
        return
    try:
        path = notice_path(state_dir, plan.job.job_id)
        write_notice(path, plan.notice)
        plan.wrote = str(path)
    except (OSError, ValueError) as exc:
        plan.failure = f"cannot write the notice of job {plan.job.job_id}: {exc}"


def _signal_group(slurm: WatcherSlurm, signal: str, group: list[_Delivery]) -> None:
    """Runs in a worker thread: one scancel for jobs that all want the same signal."""
    try:
        # By display id (A_T for array tasks): on 22.05 one task carries the array's own id, and
        # signalling that id would signal every task of the array.
        stderr = slurm.signal_many([p.job.display_id for p in group], signal, batch_only=True)
    except SlurmError as exc:  # timeout, no scancel: nothing is known to be sent; retried next poll
        for plan in group:
            plan.signal_error = str(exc)
        return
    failed = {m.group(1): m.group(2) for m in map(_SCANCEL_FAILED.search, stderr.splitlines()) if m}
    for plan in group:
        why = failed.get(plan.job.display_id, failed.get(plan.job.job_id))
        if stderr.strip() and not failed:
            plan.signal_error = stderr.strip().splitlines()[0]  # an error naming no job: retry all
        elif why is None:
            plan.signalled = "ok"
        elif any(word in why for word in _GONE_WORDS):
            plan.signalled = "gone"
        else:
            plan.signal_error = why


def _record_notice(ctx: Context, d: _Delivery) -> bool:
    if not d.write:
        return True
    if d.failure:
        log.warning("%s (will retry)", d.failure)
        return False
    job_id, notice = d.job.job_id, d.notice
    ctx.sent.mark(job_id, notice.node, "notice", ctx.clock(), notice.event_id)
    ctx.dirty = True
    log.info("job %s: notice for %s, deadline %s", job_id, notice.event_id, to_text(notice.deadline))
    fields = {"node": notice.node, "event_id": notice.event_id, "deadline": to_text(notice.deadline)}
    if d.wrote:
        fields["path"] = d.wrote
    ctx.did("notice_sent", job_id, reason=notice.reason, source_kind=notice.source, **fields)
    return True


def _record_signal(ctx: Context, d: _Delivery) -> bool:
    job_id, notice = d.job.job_id, d.notice
    if d.signal_error:
        log.warning("job %s: signal %s failed, will retry: %s", job_id, d.signal, d.signal_error)
        return False
    ctx.sent.mark(job_id, notice.node, "signal", ctx.clock(), notice.event_id)
    ctx.dirty = True
    if d.signalled == "gone":
        log.info("job %s ended before it could be signalled", job_id)
        return True
    log.info("job %s: sent SIG%s to its batch shell", job_id, d.signal)
    ctx.did("signal_sent", job_id, signal=d.signal, node=notice.node, event_id=notice.event_id)
    return True


# ---------------------------------------------------------------------------------------- enforce


def enforce_due(event: NodeEvent, margin: float, now: datetime) -> bool:
    """Not enforced yet, and ``margin`` seconds or less before the event's deadline."""
    moment = deadline(event.drain_time, event.grace) - timedelta(seconds=margin)
    return not event.enforced and now >= moment


def enforce(ctx: Context, job: Job, event: NodeEvent) -> None:
    """An opted-in job still running near the deadline is requeued, so the removal cannot kill it."""
    if not optin.parse(job.comment).signal or not job.running:
        return
    try:
        ctx.slurm.requeue(job.display_id)
    except JobGoneError:
        return
    except SlurmError as exc:
        log.warning("job %s: enforced requeue failed: %s", job.job_id, exc)
        return
    log.info("job %s: still running at deadline - margin on %s: requeued", job.job_id, event.node)
    ctx.did("enforced_requeue", job.job_id, node=event.node)


# ---------------------------------------------------------------------------------------- restart


def restart(ctx: Context, job: Job, fast: bool, fallback: bool, now: datetime) -> None:
    """For one pending job: fall back to standard nodes when its policy says so, then skip Slurm's
    ~121 s BeginTime wait after a requeue."""
    wish = optin.parse(job.comment)
    # A pending array not yet split into tasks (A_2-5%1) names no single job: nothing to do to it.
    if not wish.opted_in or not job.pending or not ids.is_job_name(job.display_id):
        return
    if fallback:
        _fallback(ctx, job, wish, now)
    requeued = job.reason == "BeginTime" and job.restart_count > 0
    if fast and wish.fast_restart and requeued and _left_nodes_still_away(ctx, job):
        _fast_restart(ctx, job)


def _left_nodes_still_away(ctx: Context, job: Job) -> bool:
    """Release a requeued job only when every node it was told to leave is still drained or down.

    Slurm's ~121 s hold is there for a reason: a job started again on the node it just left, within
    the credential's lifetime, is killed at launch ("Job credential revoked") and ends FAILED, not
    requeued. A job requeued for another reason (time limit, by hand) keeps Slurm's hold.
    """
    nodes = [key.split("|", 1)[1] for key in ctx.sent.told if key.split("|", 1)[0] == job.job_id]
    return bool(nodes) and all(node in ctx.sent.events for node in nodes)


def _fallback_why(job: Job, wish: optin.OptIn, now: datetime) -> str | None:
    if wish.fallback_after and job.restart_count >= wish.fallback_after:
        return f"preempted {job.restart_count} times (fallback-after={wish.fallback_after})"
    waited = (now - job.submit_time).total_seconds() if job.submit_time else 0.0
    if wish.fallback_pending and waited >= wish.fallback_pending:
        wanted = job.features or "its nodes"
        return f"pending {waited:.0f} s for {wanted} (fallback-pending={wish.fallback_pending:g})"
    return None


def _fallback(ctx: Context, job: Job, wish: optin.OptIn, now: datetime) -> None:
    if job.features == wish.fallback_to or ctx.sent.restarts.get(job.job_id, {}).get("fallback"):
        return
    why = _fallback_why(job, wish, now)
    if why is None:
        return
    try:
        # The scontrol keyword for a job's constraint is Features.
        ctx.slurm.update_job(job.display_id, features=wish.fallback_to)
    except SlurmError as exc:
        log.warning("job %s: fallback to %s failed, will retry: %s", job.job_id, wish.fallback_to, exc)
        return
    ctx.sent.restarts.setdefault(job.job_id, {})["fallback"] = wish.fallback_to
    ctx.dirty = True
    log.info("job %s: constraint %s -> %s: %s", job.job_id, job.features or "(none)", wish.fallback_to, why)
    ctx.did("fallback", job.job_id, why=why, before=job.features, after=wish.fallback_to)


def _fast_restart(ctx: Context, job: Job) -> None:
    # While the requeued job is still COMPLETING, Slurm accepts starttime=now but it does not take:
    # so it is sent on every poll the job still waits for BeginTime, and recorded once per restart.
    try:
        ctx.slurm.update_job(job.display_id, starttime="now")  # A_T: never the whole array
    except SlurmError as exc:
        log.warning("job %s: fast restart failed, will retry: %s", job.job_id, exc)
        return
    record = ctx.sent.restarts.setdefault(job.job_id, {})
    if record.get("fast_restart") == job.restart_count:
        return
    record["fast_restart"] = job.restart_count
    ctx.dirty = True
    log.info("job %s: requeued (restart %d): start time set to now", job.job_id, job.restart_count)
    ctx.did("fast_restart", job.job_id, restart_count=job.restart_count)
