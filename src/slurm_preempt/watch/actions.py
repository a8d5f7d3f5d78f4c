"""What the watcher does to jobs besides telling them (``watch.tell``): enforce the deadline, restart
them fast, move them to standard nodes. Every act is recorded in the ledger *before* it is made and
the record taken back when the act fails (so neither the act's own consequences nor the watcher's death
can lose it), then confirmed in the sent-state; failures are logged and retried on a later poll.

Only Slurm acts on jobs (``scancel --signal``, ``scontrol update/requeue``): no PID is ever signalled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from slurm_preempt import ids, ledger, optin
from slurm_preempt.errors import JobGoneError, SlurmError
from slurm_preempt.notice import deadline, to_text, utcnow
from slurm_preempt.records.prices import Prices
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch import cost, storm
from slurm_preempt.watch import deadline as deadline_rule
from slurm_preempt.watch.rate import read_published
from slurm_preempt.watch.sentstate import NodeEvent, SentState

log = logging.getLogger(__name__)

Emit = Callable[[dict[str, Any]], None]
Clock = Callable[[], datetime]
NO_PRICES = Prices()  # none configured: the documented discount
WARNED_KEPT = 10_000  # jobs whose bad token was logged (a watcher runs for months: memory stays flat)


class LostLease(Exception):
    """Another watcher took the lease: this one must not act (raised just before an act)."""


@dataclass
class Context:
    """Everything an action needs. ``state_dir`` None: no notice files and no ledger (signals only).
    ``may_act`` is asked right before every act on a job (the lease: False when another watcher took
    over)."""

    slurm: WatcherSlurm
    sent: SentState
    state_dir: Path | None
    emit: Emit = lambda _e: None
    clock: Clock = utcnow  # the watcher's clock (tests inject one)
    may_act: Callable[[], bool] = lambda: True
    save: Callable[[], None] = lambda: None  # writes the sent-state when it changed
    counts: dict[str, int] = field(default_factory=dict)
    prices: Prices = NO_PRICES  # [report]'s, for fallback-cost
    warned: dict[str, None] = field(default_factory=dict)  # "job: what" said once (bounded: oldest go)

    def warn_once(self, what: str, message: str, *args: Any) -> None:
        if what in self.warned:
            return
        self.warned[what] = None
        if len(self.warned) > WARNED_KEPT:
            del self.warned[next(iter(self.warned))]
        log.warning(message, *args)

    def check_lease(self) -> None:
        if not self.may_act():
            raise LostLease

    def record(self, kind: str, job_id: str, **fields: Any) -> Path | None:
        """Write a ledger event; a broken state folder is logged, not raised (None)."""
        if self.state_dir is None:
            return None
        try:
            return ledger.record(self.state_dir, job_id, kind, source="watcher", **fields)
        except (OSError, ValueError) as exc:
            log.warning("cannot write the ledger of job %s under %s: %s", job_id, self.state_dir, exc)
            return None

    def announce(self, kind: str, job_id: str, **fields: Any) -> None:
        """Count the act and emit it as a JSON event (``--json``)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.emit({"event": kind, "job_id": job_id, "time": to_text(self.clock()), **fields})

    def note(self, kind: str, job_id: str, **fields: Any) -> None:
        """Save, record and announce a fact that is no act (nothing to take back)."""
        self.save()
        self.record(kind, job_id, **fields)
        self.announce(kind, job_id, **fields)

    @contextmanager
    def recorded(self, kind: str, job_id: str, **fields: Any) -> Iterator[None]:
        """Record, act (the body), announce; an act that raises takes its record back."""
        self.check_lease()
        path = self.record(kind, job_id, **fields)
        try:
            yield
        except BaseException:
            if path is not None:
                path.unlink(missing_ok=True)
            raise
        self.announce(kind, job_id, **fields)


# ---------------------------------------------------------------------------------------- enforce


def enforce_due(event: NodeEvent, margin: float, now: datetime) -> bool:
    """Not enforced yet, and ``margin`` seconds or less before the event's deadline."""
    moment = deadline(event.drain_time, event.grace) - timedelta(seconds=margin)
    return not event.enforced and now >= moment


def enforce(ctx: Context, job: Job, event: NodeEvent) -> bool:
    """An opted-in job still running near the deadline is requeued, so the removal cannot kill it.
    False when it must be retried on the next poll (a Slurm error other than "the job is gone")."""
    if not optin.parse(job.comment).signal or not job.running:
        return True
    try:
        with ctx.recorded("enforced_requeue", job.job_id, node=event.node):
            ctx.slurm.requeue(job.display_id)
    except JobGoneError:
        return True
    except SlurmError as exc:
        log.warning("job %s: enforced requeue failed, will retry: %s", job.job_id, exc)
        return False
    log.info("job %s: still running at deadline - margin on %s: requeued", job.job_id, event.node)
    return True


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
    if not (fast and wish.fast_restart and requeued):
        return
    if (_left_nodes_still_away(ctx, job) or _grown_back(ctx, job)) and requeue_second_over(job, now):
        _fast_restart(ctx, job)


def _left_nodes_still_away(ctx: Context, job: Job) -> bool:
    """Release a requeued job only when every node it was told to leave is still drained or down.

    Slurm's ~121 s hold is there for a reason: a job started again on the node it just left, within
    the credential's lifetime, is killed at launch ("Job credential revoked") and ends FAILED, not
    requeued. A job requeued for another reason (time limit, by hand) keeps Slurm's hold.
    """
    nodes = ctx.sent.nodes_told(job.job_id)
    return bool(nodes) and all(node in ctx.sent.events for node in nodes)


def _grown_back(ctx: Context, job: Job) -> bool:
    """The job requeued itself at a grow-back in its last attempt (``watch/growback.py``; root's
    ``grow_back`` record of that attempt says so): it left no node that is going away, and Slurm keeps
    its node range, so releasing it at once lets it start on more nodes now."""
    if ctx.state_dir is None or job.restart_count <= 0:
        return False
    try:
        found = ledger.find(ctx.state_dir, job.job_id, "grow_back", restart_count=job.restart_count - 1)
    except (OSError, ValueError):
        return False
    return found is not None


# Slurm revokes the old attempt's credential on each node it leaves with the controller's time of the
# requeue, in whole seconds, and slurmd refuses a credential made in that second or before: a job
# started again there in the requeue's own second is killed at launch ("Job credential revoked") and
# ends FAILED, not requeued. A job on several nodes also leaves nodes that are not being taken away
# (an elastic --nodes=1-2 job comes back on one of them at once), so the node rule above is not enough.
# SubmitTime is set at the requeue (that second, or the next when it would repeat the last one); the
# half second covers a watcher whose clock is behind the controller's.
RELAUNCH_SAFE_AFTER = timedelta(seconds=1.5)


def requeue_second_over(job: Job, now: datetime) -> bool:
    """The requeue's second is over: no node the job left can refuse its next launch. An unknown
    SubmitTime keeps Slurm's own hold (the job waits, nothing is lost)."""
    return job.submit_time is not None and now >= job.submit_time + RELAUNCH_SAFE_AFTER


def pending_for(job: Job, now: datetime) -> float:
    """Seconds the job has been waiting while eligible to run. A requeue resets SubmitTime (verified on
    22.05 and 24.11) and the BeginTime hold after it is not a lack of capacity: count from the later of
    SubmitTime and EligibleTime (in the future while held)."""
    since = max((t for t in (job.submit_time, job.eligible_time) if t is not None), default=None)
    return max(0.0, (now - since).total_seconds()) if since else 0.0


def _fallback_why(
    job: Job, wish: optin.OptIn, now: datetime, state_dir: Path | None = None, prices: Prices = NO_PRICES
) -> str | None:
    if wish.fallback_after and job.restart_count >= wish.fallback_after:
        return f"preempted {job.restart_count} times (fallback-after={wish.fallback_after})"
    waited = pending_for(job, now)
    if wish.fallback_pending and waited >= wish.fallback_pending:
        wanted = job.features or "its nodes"
        return f"pending {waited:.0f} s for {wanted} (fallback-pending={wish.fallback_pending:g})"
    judged = wish.fallback_deadline is not None or wish.fallback_storm or wish.fallback_cost is not None
    if not judged or state_dir is None:
        return None
    try:
        events = ledger.trusted_events(state_dir, job.job_id)
    except (OSError, ValueError) as exc:
        log.warning("job %s: ledger unreadable, its progress not judged: %s", job.job_id, exc)
        return None
    stormy = storm.storm(events, job.restart_count, wish.fallback_storm or 0, now)
    if stormy is not None:
        return stormy
    if wish.fallback_deadline is not None:
        late = deadline_rule.behind(deadline_rule.progress_of(events, now), wish.fallback_deadline, now)
        if late is not None:
            return late
    if wish.fallback_cost is None:
        return None
    asked = cost.CostWish(job.job_id, job.restart_count, job.features, job.num_nodes, wish.fallback_cost)
    return cost.judge(asked, events, read_published(state_dir), prices, now)


def _fallback(ctx: Context, job: Job, wish: optin.OptIn, now: datetime) -> None:
    if job.features == wish.fallback_to or ctx.sent.restarts_of(job.job_id).fallback:
        return
    bad = optin.unread_cost(job.comment)
    if bad is not None:
        ctx.warn_once(f"{job.job_id}: cost", "job %s: fallback-cost=%r ignored (a whole percent, 0-%d)",
                      job.job_id, bad, optin.MAX_MARGIN_PERCENT)  # fmt: skip
    why = _fallback_why(job, wish, now, ctx.state_dir, ctx.prices)
    if why is None:
        return
    try:
        with ctx.recorded("fallback", job.job_id, why=why, before=job.features, after=wish.fallback_to):
            # The scontrol keyword for a job's constraint is Features.
            ctx.slurm.update_job(job.display_id, features=wish.fallback_to)
    except SlurmError as exc:
        log.warning("job %s: fallback to %s failed, will retry: %s", job.job_id, wish.fallback_to, exc)
        return
    ctx.sent.record_fallback(job.job_id, wish.fallback_to)
    log.info("job %s: constraint %s -> %s: %s", job.job_id, job.features or "(none)", wish.fallback_to, why)


def _fast_restart(ctx: Context, job: Job) -> None:
    # While the requeued job is still COMPLETING, Slurm accepts starttime=now but it does not take:
    # so it is sent on every poll the job still waits for BeginTime, and recorded once per restart.
    try:
        if ctx.sent.restarts_of(job.job_id).fast_restart == job.restart_count:
            ctx.check_lease()
            ctx.slurm.update_job(job.display_id, starttime="now")  # A_T: never the whole array
            return
        with ctx.recorded("fast_restart", job.job_id, restart_count=job.restart_count):
            ctx.slurm.update_job(job.display_id, starttime="now")
    except SlurmError as exc:
        log.warning("job %s: fast restart failed, will retry: %s", job.job_id, exc)
        return
    ctx.sent.record_fast_restart(job.job_id, job.restart_count)
    log.info("job %s: requeued (restart %d): start time set to now", job.job_id, job.restart_count)
