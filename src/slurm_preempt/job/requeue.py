"""Requeue this job from inside it: ``scontrol requeue $SLURM_JOB_ID``.

An array task is named ``ARRAY_TASK`` (never by a bare id that may be the whole array's), so it
requeues only itself. Slurm then sends the job SIGTERM, waits KillWait and sends SIGKILL; the job is
PENDING again with its restart count +1. The caller must ignore that SIGTERM (``Run`` does) and exit
promptly. Import-light: ``slurm.py`` (which
pulls in ClusterShell) is imported only when a requeue is actually asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_preempt.job.environment import JobEnv, LedgerWriter, requeue_id


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str


def requeue_self(env: JobEnv, ledger: LedgerWriter, step: int | None = None, events=()) -> Outcome:
    """Ask Slurm to requeue this job; record ``requeued`` in the ledger. Never raises."""
    if not env.job_id:
        return Outcome(False, "not inside a Slurm job (SLURM_JOB_ID is unset): nothing to requeue")
    from slurm_preempt.errors import SlurmPreemptError
    from slurm_preempt.slurm.commands import Slurm

    try:
        Slurm(timeout=30).requeue(requeue_id(env))
    except SlurmPreemptError as exc:
        return Outcome(False, f"cannot requeue job {env.job_id}: {exc}")
    event_ids = sorted(events)
    ledger.record(
        "requeued",
        step=step,
        attempt=env.restart_count + 1,
        event_id=event_ids[0] if event_ids else "",
        how="scontrol requeue",
    )
    return Outcome(True, f"job {env.job_id} requeued (attempt {env.restart_count + 1} ends)")
