"""What the watcher does to jobs: tell them (notice + signal), enforce the deadline, restart them fast,
move them to standard nodes. Every action is recorded in the sent-state (so it is never repeated) and
in the ledger; failures are logged and retried on a later poll, never raised.

Only Slurm acts on jobs (``scancel --signal``, ``scontrol update/requeue``): no PID is ever signalled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from . import ledger, optin
from .errors import JobGoneError, SlurmError
from .notice import Notice, notice_path, to_text, utcnow, write_notice
from .sentstate import NodeEvent, SentState
from .slurm import Slurm
from .slurmdata import Job

Log = Callable[[str], None]
Emit = Callable[[dict], None]


@dataclass
class Context:
    """Everything an action needs. ``state_dir`` None: no notice files and no ledger (signals only)."""

    slurm: Slurm
    sent: SentState
    state_dir: Path | None
    log: Log = lambda _m: None
    emit: Emit = lambda _e: None
    save: Callable[[], None] = lambda: None  # persists the sent-state when dirty
    dirty: bool = False  # sent-state changed since the last save
    counts: dict[str, int] = field(default_factory=dict)

    def did(self, kind: str, job_id: str, **fields) -> None:
        """Save what was done, then count, emit a JSON event and write the ledger (a broken state
        folder is logged, not raised). Saving first: a watcher killed here must not redo the action."""
        self.save()
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.emit({"event": kind, "job_id": job_id, "time": to_text(utcnow()), **fields})
        if self.state_dir is None:
            return
        try:
            ledger.record(self.state_dir, job_id, kind, source="watcher", **fields)
        except (OSError, ValueError) as exc:
            self.log(f"cannot write the ledger of job {job_id} under {self.state_dir}: {exc}")


# ---------------------------------------------------------------------------------------- tell


def tell(ctx: Context, job: Job, event: NodeEvent) -> bool:
    """Notice file, then signal if the job opted in; each exactly once per job and node event.
    Returns False when something must be retried on the next poll."""
    wish = optin.parse(job.comment)
    notice = Notice.for_drain(
        job.job_id, event.node, event.reason, event.source, event.drain_time, event.grace
    )
    complete = _write_notice(ctx, job, notice)
    if wish.signal and not ctx.sent.done(job.job_id, event.node, "signal"):
        complete = _signal(ctx, job, wish.signal, notice) and complete
    return complete


def _in_ledger(ctx: Context, job_id: str, kind: str, event_id: str) -> bool:
    """Another watcher (a job's sidecar next to the daemon, or a daemon whose state was lost) already
    did this for this event: the shared ledger says so."""
    if ctx.state_dir is None:
        return False
    try:
        found = ledger.events(ctx.state_dir, job_id)
    except (OSError, ValueError):
        return False
    return any(e.get("kind") == kind and e.get("event_id") == event_id for e in found)


def _write_notice(ctx: Context, job: Job, notice: Notice) -> bool:
    if ctx.sent.done(job.job_id, notice.node, "notice"):
        return True
    if _in_ledger(ctx, job.job_id, "notice_sent", notice.event_id):
        ctx.sent.mark(job.job_id, notice.node, "notice", utcnow(), notice.event_id)
        ctx.dirty = True
        return True
    fields = {"node": notice.node, "event_id": notice.event_id, "deadline": to_text(notice.deadline)}
    if ctx.state_dir is not None:
        path = notice_path(ctx.state_dir, job.job_id)
        try:
            write_notice(path, notice)
        except OSError as exc:
            ctx.log(f"cannot write the notice of job {job.job_id} to {path}: {exc}")
            return False
        fields["path"] = str(path)
    ctx.sent.mark(job.job_id, notice.node, "notice", utcnow(), notice.event_id)
    ctx.dirty = True
    ctx.log(f"job {job.job_id}: notice for {notice.event_id}, deadline {to_text(notice.deadline)}")
    ctx.did("notice_sent", job.job_id, reason=notice.reason, source_kind=notice.source, **fields)
    return True


def _signal(ctx: Context, job: Job, signal: str, notice: Notice) -> bool:
    if _in_ledger(ctx, job.job_id, "signal_sent", notice.event_id):
        ctx.sent.mark(job.job_id, notice.node, "signal", utcnow(), notice.event_id)
        ctx.dirty = True
        return True
    try:
        ctx.slurm.signal(job.job_id, signal, batch_only=True)
    except JobGoneError:
        ctx.log(f"job {job.job_id} ended before it could be signalled")
        ctx.sent.mark(job.job_id, notice.node, "signal", utcnow(), notice.event_id)
        ctx.dirty = True
        return True
    except SlurmError as exc:
        ctx.log(f"job {job.job_id}: signal {signal} failed, will retry: {exc}")
        return False
    ctx.sent.mark(job.job_id, notice.node, "signal", utcnow(), notice.event_id)
    ctx.dirty = True
    ctx.log(f"job {job.job_id}: sent SIG{signal} to its batch shell")
    ctx.did("signal_sent", job.job_id, signal=signal, node=notice.node, event_id=notice.event_id)
    return True


# ---------------------------------------------------------------------------------------- enforce


def enforce_due(event: NodeEvent, margin: float, now: datetime) -> bool:
    deadline = event.drain_time + timedelta(seconds=event.grace)
    return not event.enforced and now >= deadline - timedelta(seconds=margin)


def enforce(ctx: Context, job: Job, event: NodeEvent) -> None:
    """An opted-in job still running near the deadline is requeued, so the removal cannot kill it."""
    if not optin.parse(job.comment).signal or not job.running:
        return
    try:
        ctx.slurm.requeue(job.job_id)
    except JobGoneError:
        return
    except SlurmError as exc:
        ctx.log(f"job {job.job_id}: enforced requeue failed: {exc}")
        return
    ctx.log(f"job {job.job_id}: still running at deadline - margin on {event.node}: requeued")
    ctx.did("enforced_requeue", job.job_id, node=event.node)


# ---------------------------------------------------------------------------------------- restart


def restart(ctx: Context, job: Job, fast: bool, fallback: bool, now: datetime) -> None:
    """For one pending job: fall back to standard nodes when its policy says so, then skip Slurm's
    ~121 s BeginTime wait after a requeue."""
    wish = optin.parse(job.comment)
    if not wish.opted_in or not job.pending:
        return
    if fallback:
        _fallback(ctx, job, wish, now)
    if fast and wish.fast_restart and job.reason == "BeginTime" and job.restart_count > 0:
        _fast_restart(ctx, job)


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
        ctx.slurm.update_job(job.job_id, features=wish.fallback_to)
    except SlurmError as exc:
        ctx.log(f"job {job.job_id}: fallback to {wish.fallback_to} failed, will retry: {exc}")
        return
    ctx.sent.restarts.setdefault(job.job_id, {})["fallback"] = wish.fallback_to
    ctx.dirty = True
    ctx.log(f"job {job.job_id}: constraint {job.features or '(none)'} -> {wish.fallback_to}: {why}")
    ctx.did("fallback", job.job_id, why=why, before=job.features, after=wish.fallback_to)


def _fast_restart(ctx: Context, job: Job) -> None:
    # While the requeued job is still COMPLETING, Slurm accepts starttime=now but it does not take:
    # so it is sent on every poll the job still waits for BeginTime, and recorded once per restart.
    try:
        ctx.slurm.update_job(job.job_id, starttime="now")
    except SlurmError as exc:
        ctx.log(f"job {job.job_id}: fast restart failed, will retry: {exc}")
        return
    record = ctx.sent.restarts.setdefault(job.job_id, {})
    if record.get("fast_restart") == job.restart_count:
        return
    record["fast_restart"] = job.restart_count
    ctx.dirty = True
    ctx.log(f"job {job.job_id}: requeued (restart {job.restart_count}): start time set to now")
    ctx.did("fast_restart", job.job_id, restart_count=job.restart_count)
