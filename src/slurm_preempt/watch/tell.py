"""Telling jobs that their node is going away: the notice file, then a signal for jobs that opted in.

Many jobs at once (a correlated preemption drains many nodes): every notice file first (in worker
threads), then one ``scancel`` per signal name for all the jobs, in a few batches side by side. Each
act is recorded before it is made (write intent, act, confirm):

* notice: the ``notice_sent`` ledger record, then the file; a failed write takes the record back. A
  watcher that finds the file already holding the event does not write it again.
* signal: the batch's intent in the outbox (``watch.outbox``), the ``signal_sent`` ledger records,
  then the helper that sends it; its outcome confirms each job in the sent-state, and takes the record
  back for a job scancel could not signal. A job's own sidecar that the signal ends (the job requeues
  itself) has recorded what it did before doing it.
"""

from __future__ import annotations

import functools
import logging
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from slurm_preempt import ledger, optin
from slurm_preempt.notice import Notice, notice_path, read_notice, to_text, write_notice
from slurm_preempt.slurm.commands import job_gone
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch.actions import Context
from slurm_preempt.watch.outbox import Batch, Item, Outbox
from slurm_preempt.watch.sentstate import NodeEvent
from slurm_preempt.watch.threads import side_by_side

log = logging.getLogger(__name__)

# scancel names each job it could not signal: "scancel: error: Kill job error on job id 12: <why>".
_SCANCEL_FAILED = re.compile(r"job id (\d+(?:_\d+)?)\S*:?\s*(.*)")
BATCHES = 4  # scancel batches side by side
LEAST = 8  # jobs per batch at least


@dataclass
class _Delivery:
    """One job's notice and signal, as planned, then as done."""

    job: Job
    notice: Notice
    write: bool  # the notice file is still to be written
    signal: str | None  # the signal still to be sent
    wrote: str = ""  # the path written
    failure: str = ""  # why the notice could not be written
    record: Path | None = None  # the notice_sent ledger record


def tell_many(
    ctx: Context, outbox: Outbox, pairs: list[tuple[Job, NodeEvent, bool]], in_flight: set[str]
) -> set[str]:
    """Tell each job of its event (with a signal when the flag says it may get one, and it opted in).
    ``in_flight``: jobs whose signal an earlier batch is still sending. Returns the ids to retry."""
    plans = [_plan(ctx, job, event, may_signal, in_flight) for job, event, may_signal in pairs]
    _check_files(ctx, plans)
    plans = [p for p in plans if p.write or p.signal]
    by_signal: dict[str, list[_Delivery]] = {}
    for plan in plans:
        if plan.signal:
            by_signal.setdefault(plan.signal, []).append(plan)
    wanted = [
        (sig, [_item(p) for p in chunk])
        for sig, group in sorted(by_signal.items())
        for chunk in _chunk(group)
    ]
    batches = outbox.plan(wanted)  # their senders start while the notices are written
    retry = {p.job.job_id for p in _notices(ctx, plans) if p.failure}
    ctx.save()  # the notices are in the state before any signal (a signal may end a sidecar's job)
    ctx.check_lease()
    outbox.write(batches)
    records = {(i.job_id, i.event_id): _record_signal(ctx, i, b.signal) for b in batches for i in b.items}
    finished, pending = outbox.send(batches)
    in_flight |= pending
    retry |= {item.job_id for item in confirm(ctx, finished, records)}
    outbox.finish(finished)
    return retry


def tell(ctx: Context, outbox: Outbox, job: Job, event: NodeEvent) -> bool:
    """One job: False when something must be retried on the next poll."""
    return not tell_many(ctx, outbox, [(job, event, True)], set())


def _plan(ctx: Context, job: Job, event: NodeEvent, may_signal: bool, in_flight: set[str]) -> _Delivery:
    wish = optin.parse(job.comment)
    notice = Notice.for_drain(
        job.job_id,
        event.node,
        event.reason,
        event.source,
        event.drain_time,
        event.grace,
        ctx.clock(),
        restart_count=job.restart_count,  # the attempt it is for (squeue's RestartCnt)
    )
    write = not ctx.sent.done(job.job_id, notice.node, "notice")
    signal = wish.signal if may_signal and wish.signal else None
    if signal and (job.job_id in in_flight or ctx.sent.done(job.job_id, notice.node, "signal")):
        signal = None
    return _Delivery(job, notice, write, signal)


def _check_files(ctx: Context, plans: list[_Delivery]) -> None:
    """What the sent-state does not know, the files may: a notice already holding this event, or a
    ``signal_sent`` record of another watcher (a job's sidecar next to the daemon, a daemon whose state
    was lost, one that died between its record and the file). Read in worker threads: each job's
    notice file and folder (bounded, but on shared storage), so one slow folder holds no other job's
    plan; the sent-state is marked here."""
    if ctx.state_dir is None:
        return
    state_dir = ctx.state_dir
    unsure = [p for p in plans if p.write or p.signal]
    found = side_by_side(lambda plan: _on_disk(state_dir, plan), unsure)
    for plan, (noticed, signalled) in zip(unsure, found, strict=True):
        if noticed:
            plan.write = False
            _mark(ctx, plan.job, plan.notice, "notice")
        if signalled:
            plan.signal = None
            _mark(ctx, plan.job, plan.notice, "signal")


def _on_disk(state_dir: Path, plan: _Delivery) -> tuple[bool, bool]:
    job, notice = plan.job, plan.notice
    noticed = False
    if plan.write:
        found = read_notice(notice_path(state_dir, job.job_id))
        noticed = (
            found is not None
            and found.event_id == notice.event_id
            and found.restart_count == notice.restart_count
        )
    signalled = bool(plan.signal) and (
        _ledger_has(state_dir, job.job_id, "signal_sent", notice.event_id, _uid_of(job.user)) is not None
    )
    return noticed, signalled


def _ledger_has(
    state_dir: Path, job_id: str, kind: str, event_id: str, owner: int | None = None
) -> Path | None:
    """The ledger record of ``kind`` for this event, if there is one: ours, root's, or (``owner``) the
    job's own sidecar's when the folder is its user's. An unreadable folder (past the bounds) has none:
    the sent-state alone then says what was done."""
    try:
        return ledger.find(state_dir, job_id, kind, owner, event_id=event_id)
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid if user else None
    except KeyError:  # a user this host does not know: only root's and our own records count
        return None


def _mark(ctx: Context, job: Job, notice: Notice, what: str) -> None:
    ctx.sent.mark_told(
        job.job_id, notice.node, what, ctx.clock(), notice.event_id, job.restart_count, notice.deadline
    )


def _item(plan: _Delivery) -> Item:
    return Item(plan.job.job_id, plan.job.display_id, plan.notice.node, plan.notice.event_id)


def _chunk(plans: list[_Delivery]) -> list[list[_Delivery]]:
    size = max(LEAST, -(-len(plans) // BATCHES))
    return [plans[i : i + size] for i in range(0, len(plans), size)]


# ---------------------------------------------------------------------------------------- notices


def _notices(ctx: Context, plans: list[_Delivery]) -> list[_Delivery]:
    """Record and write every notice (in threads: file I/O only), then confirm them here."""
    writing = [p for p in plans if p.write]
    if ctx.state_dir is not None and writing:
        ctx.check_lease()
        side_by_side(lambda p: _write(ctx, p), writing)
    for plan in writing:
        _confirm_notice(ctx, plan)
    return writing


def _write(ctx: Context, plan: _Delivery) -> None:
    assert ctx.state_dir is not None
    job_id, notice = plan.job.job_id, plan.notice
    if _ledger_has(ctx.state_dir, job_id, "notice_sent", notice.event_id, _uid_of(plan.job.user)) is None:
        plan.record = ctx.record("notice_sent", job_id, **_notice_fields(notice, ctx.state_dir))
    try:
        path = notice_path(ctx.state_dir, job_id)
        write_notice(path, notice)
        plan.wrote = str(path)
    except (OSError, ValueError) as exc:
        plan.failure = f"cannot write the notice of job {job_id}: {exc}"
        if plan.record is not None:
            plan.record.unlink(missing_ok=True)


def _notice_fields(notice: Notice, state_dir: Path | None) -> dict:
    fields = {
        "reason": notice.reason,
        "source_kind": notice.source,
        "node": notice.node,
        "event_id": notice.event_id,
        "deadline": to_text(notice.deadline),
    }
    if state_dir is not None:
        fields["path"] = str(notice_path(state_dir, notice.job_id))
    return fields


def _confirm_notice(ctx: Context, plan: _Delivery) -> None:
    if plan.failure:
        log.warning("%s (will retry)", plan.failure)
        return
    job_id, notice = plan.job.job_id, plan.notice
    _mark(ctx, plan.job, notice, "notice")
    if ctx.state_dir is None:
        return  # no state folder: signals only
    log.info("job %s: notice for %s, deadline %s", job_id, notice.event_id, to_text(notice.deadline))
    ctx.announce("notice_sent", job_id, **_notice_fields(notice, ctx.state_dir))


# ---------------------------------------------------------------------------------------- signals


def _record_signal(ctx: Context, item: Item, signal: str) -> Path | None:
    return ctx.record("signal_sent", item.job_id, signal=signal, node=item.node, event_id=item.event_id)


def confirm(ctx: Context, batches: list[Batch], records: dict[tuple[str, str], Path | None]) -> list[Item]:
    """What each batch's scancel said, per job: confirmed in the sent-state, or taken back and retried.
    ``records``: the ledger records written for these jobs (leftovers of an earlier watcher: looked up).
    Returns the jobs to signal again."""
    retry: list[Item] = []
    for batch in batches:
        failed = _scancel_failures(batch)
        for item in batch.items:
            why = failed.get(item.display_id, failed.get(item.job_id)) if failed is not None else batch.error
            key = (item.job_id, item.event_id)
            record = records[key] if key in records else _lookup(ctx, item)
            if why and not job_gone(why):
                log.warning("job %s: signal %s failed, will retry: %s", item.job_id, batch.signal, why)
                _take_back(record)
                retry.append(item)
                continue
            ctx.sent.mark_told(item.job_id, item.node, "signal", ctx.clock(), item.event_id)
            if why:
                log.info("job %s ended before it could be signalled", item.job_id)
                _take_back(record)
                continue
            if record is None and key not in records:  # an earlier watcher died before its record
                _record_signal(ctx, item, batch.signal)
            if batch.unknown:
                log.warning(
                    "job %s: SIG%s taken as sent (its sender died mid-way)", item.job_id, batch.signal
                )
            else:
                log.info("job %s: sent SIG%s to its batch shell", item.job_id, batch.signal)
            fields = {"signal": batch.signal, "node": item.node, "event_id": item.event_id}
            ctx.announce("signal_sent", item.job_id, **fields)
    return retry


def _scancel_failures(batch: Batch) -> dict[str, str] | None:
    """Job -> why scancel could not signal it; None when scancel failed as a whole (``error``, or a
    complaint naming no job): then every job of the batch is retried."""
    if batch.error or batch.unknown:
        return None if batch.error else {}
    lines = batch.stderr.strip().splitlines()
    failed = {m.group(1): m.group(2) for m in map(_SCANCEL_FAILED.search, lines) if m}
    if lines and not failed:
        batch.error = lines[0]
        return None
    return failed


def _lookup(ctx: Context, item: Item) -> Path | None:
    if ctx.state_dir is None:
        return None
    return _ledger_has(ctx.state_dir, item.job_id, "signal_sent", item.event_id)


def _take_back(record: Path | None) -> None:
    if record is not None:
        record.unlink(missing_ok=True)
