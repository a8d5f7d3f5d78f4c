"""Requeue this job from inside it: ``scontrol requeue $SLURM_JOB_ID``.

An array task is named ``ARRAY_TASK`` (never by a bare id that may be the whole array's), so it
requeues only itself. Slurm then sends the job SIGTERM, waits KillWait and sends SIGKILL; the job is
PENDING again with its restart count +1. The caller must ignore that SIGTERM (``Run`` does) and exit
promptly. On more than one node the writer rank does not requeue (``leave``): the batch script does,
once the command's steps have ended. Import-light: ``slurm.py`` (which
pulls in ClusterShell) is imported only when a requeue is actually asked for.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slurm_preempt.job.environment import ENV_SCRIPT_DECIDES, ENV_SCRIPT_REQUEUES, JobEnv, requeue_id
from slurm_preempt.job.ledger_writer import LedgerWriter

log = logging.getLogger(__name__)


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


def leave(
    env: JobEnv,
    ledger: LedgerWriter,
    *,
    step: int,
    events: Iterable[str],
    exit_code: int,
    requeue_exit_code: int | None,
    seconds_left: Callable[[], float | None],
) -> None:
    """The writer rank's way out after its final checkpoint at ``step``: exit at once outside Slurm,
    when the job script shrinks the job (``job/shrink.py``) or when it requeues it (``ENV_SCRIPT_REQUEUES``),
    else requeue and exit ``exit_code``, else ``fallback_exit``. Raises SystemExit only."""
    if not env.job_id:
        log.info("not inside a Slurm job: final checkpoint at step %d saved, exiting %d", step, exit_code)
        sys.exit(exit_code)
    if os.environ.get(ENV_SCRIPT_DECIDES):
        from slurm_preempt.job.shrink import would_shrink

        decision = would_shrink()
        if decision.shrink:  # the batch script goes on without the leaving nodes
            _mark_final_durable()  # a step that does not end by itself is ended then
            log.info("final checkpoint at step %d saved: the job script shrinks the job", step)
            sys.exit(exit_code)
        log.info("requeue, not shrink: %s", decision.why_not)
    if _left_to_the_script(step):
        sys.exit(exit_code)
    outcome = requeue_self(env, ledger, step=step, events=events)
    if outcome.ok:
        log.info("%s", outcome.message)
        sys.exit(exit_code)
    fallback_exit(outcome.message, requeue_exit_code, seconds_left())


def _left_to_the_script(step: int) -> bool:
    """On more than one node: tell the batch script to requeue the job once its steps have ended (it
    names the file in ``ENV_SCRIPT_REQUEUES``). False where it does not, or the file cannot be made."""
    # A requeue sent while the step runs makes slurmctld end the job under it: slurmd's
    # _rpc_terminate_job (src/slurmd/slurmd/req.c) sends SIGTERM to every step and waits up to
    # KillWait for them (pause_for_job_completion), while srun reports "Job step aborted: Waiting up to
    # KillWait+2 seconds" and ends the step itself. Exiting instead lets every rank and torchrun agent
    # end on its own; the batch script requeues once srun has returned, when slurmd finds only the
    # batch step left to end.
    if not _mark_final_durable():
        return False
    log.info("final checkpoint at step %d saved: the job script requeues the job once its steps end", step)
    return True


def _mark_final_durable() -> bool:
    """Make the file named in ``ENV_SCRIPT_REQUEUES``: the final checkpoint is durable, the batch script
    takes the job from here (and ends a step that does not end by itself). False without the file."""
    marker = os.environ.get(ENV_SCRIPT_REQUEUES)
    if not marker:
        return False
    try:
        open(marker, "a").close()  # noqa: SIM115
    except OSError as exc:
        log.warning("cannot tell the job script to requeue (%s): requeueing from here", exc)
        return False
    return True


# When Slurm cannot be asked to requeue: how long past the deadline to wait for the node to go.
FALLBACK_WAIT_PAST_DEADLINE = 300.0


def fallback_exit(message: str, requeue_exit_code: int | None, seconds_left: float | None) -> None:
    """Slurm could not be asked to requeue. Exit with the site's RequeueExit code when configured; else
    stay alive until the node goes (Slurm requeues a --requeue job killed by NODE_FAIL or preemption)."""
    if requeue_exit_code is not None:
        log.warning(
            "%s; exiting %d (requeue_exit_code) so RequeueExit= requeues the job", message, requeue_exit_code
        )
        sys.exit(int(requeue_exit_code))
    wait = max(seconds_left or 0.0, 0.0) + FALLBACK_WAIT_PAST_DEADLINE
    log.warning(
        "%s; checkpoint saved; waiting up to %.0f s for Slurm to end and requeue the job", message, wait
    )
    time.sleep(wait)
    log.error("still running after the deadline: exiting 1 (the job is not requeued; resubmit it)")
    sys.exit(1)
