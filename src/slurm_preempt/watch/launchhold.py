"""Jobs Slurm holds because their launch failed, and because of MaxBatchRequeue.

When a batch job's launch fails (its prolog fails, or the node goes away while the job starts), Slurm
requeues it and holds it: ``squeue`` says "launch failed requeued held" and the job waits for its owner
to release it, on every release we run (22.05, 24.11, 26.05). From 23.02 every such failure also counts
toward ``MaxBatchRequeue`` (default 5); past it the reason is "launch failure limit exceeded requeued
held" (22.05 names it ``JobHoldMaxRequeue``) and only an operator may release the job. A preemption
itself never counts: a node set DOWN under a job, or the job's own requeue after a notice, leaves the
count alone (a job preempted six times finishes on all three releases).

On preemptible capacity a failed launch most often means the node was taken while the job started. The
watcher moves such an opted-in job to its fallback constraint (standard nodes) and releases it, once per
job: a job that fails to launch again is left held, since releasing it over and over would drain one
node after another (a failed prolog drains its node). Each time it says so in its log and in the job's
ledger (``launch_held`` events, which ``history`` shows). That it released a job is remembered in the
watcher's own state (``SentState.released``), which only the watcher writes: the job's ledger folder is
its owner's, who could delete the event there and have a job past MaxBatchRequeue released again and
again. A ``launch_held`` event that root (or a listed writer) wrote still counts, for releases made
before the state kept them.
"""

from __future__ import annotations

import logging

from slurm_preempt import ledger, optin
from slurm_preempt.errors import SlurmError
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch.actions import Context

log = logging.getLogger(__name__)

LAUNCH_FAILED = "launch failed requeued held"
# 23.02+ prints the state description; 22.05 the reason's own name.
LIMIT_REACHED = ("launch failure limit exceeded requeued held", "JobHoldMaxRequeue")


# Past the limit the job's state is REQUEUE_HOLD, which `squeue -t pending` leaves out (24.11, 26.05).
HELD_STATES = ("PENDING", "REQUEUE_HOLD")
PENDING_STATES = "pending,requeue_hold"  # what the watcher asks squeue for


def held_for_launch(job: Job) -> bool:
    return job.state in HELD_STATES and (job.reason == LAUNCH_FAILED or job.reason in LIMIT_REACHED)


def handle(ctx: Context, job: Job, fallback: bool) -> bool:
    """Deal with an opted-in ``job`` a failed launch holds (True); leave any other to the caller (False)."""
    record = ctx.sent.restarts_of(job.job_id)
    if job.pending and job.reason == "BeginTime" and record.launch_moved == job.restart_count:
        # Released onto other nodes: Slurm's requeue hold protects nothing there (no credential of
        # this job was revoked on them). Sent each poll until it takes (not while still completing).
        _start_now(ctx, job)
        return True
    if not held_for_launch(job):
        return False
    wish = optin.parse(job.comment)
    if not wish.opted_in:
        return False
    if record.launch_held == job.restart_count:
        return True  # this hold is dealt with already
    ctx.sent.record_launch_held(job.job_id, job.restart_count)
    limit = job.reason in LIMIT_REACHED
    why = (
        "Slurm holds it after MaxBatchRequeue failed launches"
        if limit
        else "its launch failed (node lost while it started, or a failed prolog) and Slurm holds it"
    )
    shown = job.display_id
    if _released_before(ctx, job.job_id):
        log.warning(
            "job %s: %s, again; it was released once already, so it stays held: "
            "`scontrol release %s` once the cause is fixed",
            shown,
            why,
            shown,
        )
        ctx.note("launch_held", job.job_id, limit=limit, released=False, restart_count=job.restart_count)
        return True
    ctx.sent.record_released(job.job_id, ctx.clock())
    ctx.save()  # this hold is dealt with, and the release remembered, before anything is done about it
    moved = _move(ctx, job, wish) if fallback else None
    fields = {"limit": limit, "fallback": moved, "restart_count": job.restart_count}
    error = _release(ctx, job, fields)
    if error is not None:
        ctx.sent.take_back_released(job.job_id)
    if error is None and moved:
        ctx.sent.record_launch_moved(job.job_id, job.restart_count)
        _start_now(ctx, job)
    if error is None:
        where = f"moved to {moved} and " if moved else ""
        log.warning("job %s: %s; %sreleased", shown, why, where)
    else:
        log.warning("job %s: %s; could not release it (%s): an operator must", shown, why, error)
        ctx.note("launch_held", job.job_id, released=False, **fields)
    return True


def _released_before(ctx: Context, job_id: str) -> bool:
    """From the watcher's state (it holds across watcher restarts and the job's runs in between), or a
    release root recorded in the ledger before the state kept them (never the owner's word on it)."""
    if ctx.sent.released(job_id):
        return True
    if ctx.state_dir is None:
        return False
    try:
        return ledger.find(ctx.state_dir, job_id, "launch_held", None, released=True) is not None
    except (OSError, ValueError):
        return False


def _move(ctx: Context, job: Job, wish: optin.OptIn) -> str | None:
    if job.features == wish.fallback_to:
        return None
    try:
        ctx.check_lease()
        ctx.slurm.update_job(job.display_id, features=wish.fallback_to)
    except SlurmError as exc:
        log.warning("job %s: fallback to %s failed: %s", job.display_id, wish.fallback_to, exc)
        return None
    return wish.fallback_to


def _start_now(ctx: Context, job: Job) -> None:
    try:
        ctx.check_lease()
        ctx.slurm.update_job(job.display_id, starttime="now")
    except SlurmError as exc:
        log.warning("job %s: start time not set, will retry: %s", job.display_id, exc)


def _release(ctx: Context, job: Job, fields: dict) -> str | None:
    """Recorded before it is made (``_released_before`` reads it): a watcher killed right after the
    release must not release the job a second time."""
    try:
        with ctx.recorded("launch_held", job.job_id, released=True, **fields):
            ctx.slurm.release(job.display_id)
    except SlurmError as exc:
        return str(exc)
    return None
