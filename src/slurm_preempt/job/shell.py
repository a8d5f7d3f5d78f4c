"""What ``slurm-preempt resume ...`` does for shell jobs: the library behind the thin CLI.

Each function reads the job's environment itself, so a bash script needs no Python of its own.
Import-light: standard library only (Slurm commands load only to requeue).
"""

from __future__ import annotations

import shlex
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_preempt.errors import EXIT_SLURM, CheckpointError
from slurm_preempt.job import settings as job_settings
from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore, pid_alive
from slurm_preempt.job.environment import JobEnv, fresh_notice
from slurm_preempt.job.ledger_writer import LedgerWriter
from slurm_preempt.notice import Notice, deadline, to_text, utcnow

# `resume wait` exit codes (documented in docs/resume.md)
WAIT_NOTICE = 0
WAIT_PROCESS_ENDED = 1
WAIT_TIMEOUT = 7


def _handled(env: JobEnv, ledger: LedgerWriter, latest: Checkpoint | None) -> set[str]:
    handled = ledger.handled_events()
    if latest is not None:
        handled.update(latest.meta.get("handled_events", []))
    return handled


def env_info(checkpoint_dir: Path | None) -> dict:
    """Restart facts and the latest intact checkpoint, as one dict (also the ``--json`` output)."""
    env = JobEnv.from_environ()
    latest = CheckpointStore(Path(checkpoint_dir).absolute()).latest() if checkpoint_dir else None
    previous = latest.meta.get("num_nodes") if latest else None
    return {
        "job_id": env.job_id,
        "restart_count": env.restart_count,
        "attempt": env.restart_count + 1,
        "resume": bool(latest) or env.restart_count > 0,
        "latest_checkpoint": str(latest.path) if latest else "",
        "latest_step": latest.step if latest else None,
        "nodes": env.num_nodes,
        "previous_nodes": previous,
        "notice_file": str(env.notice_file or ""),
    }


def export_lines(info: dict) -> list[str]:
    values = {
        "SLURM_PREEMPT_RESTART_COUNT": info["restart_count"],
        "SLURM_PREEMPT_ATTEMPT": info["attempt"],
        "SLURM_PREEMPT_RESUME_FLAG": "1" if info["latest_checkpoint"] else "",
        "SLURM_PREEMPT_LATEST_CHECKPOINT": info["latest_checkpoint"],
        "SLURM_PREEMPT_LATEST_STEP": "" if info["latest_step"] is None else info["latest_step"],
        "SLURM_PREEMPT_NODES": info["nodes"],
        "SLURM_PREEMPT_PREVIOUS_NODES": info["previous_nodes"] or "",
    }
    return [f"export {name}={shlex.quote(str(value))}" for name, value in values.items()]


def latest(checkpoint_dir: Path) -> Checkpoint:
    found = CheckpointStore(Path(checkpoint_dir).absolute()).latest()
    if found is None:
        raise CheckpointError(f"no intact checkpoint in {checkpoint_dir} (a first run starts from scratch)")
    return found


def save_paths(checkpoint_dir: Path, step: int, paths: list[Path], keep: int | None = None) -> Checkpoint:
    """Copy ``paths`` into checkpoint ``step`` atomically and record it in the ledger."""
    env = JobEnv.from_environ()
    ledger = LedgerWriter.for_job(env)
    store = CheckpointStore(Path(checkpoint_dir).absolute(), keep=keep or job_settings.load().keep)
    handled = _handled(env, ledger, store.latest(verify=False))
    notice = fresh_notice(env, handled)
    if notice is not None and notice.event_id:
        handled.add(notice.event_id)  # the resumed attempt must not act on this notice again
    meta = {
        "job_id": env.job_id,
        "attempt": env.restart_count + 1,
        "num_nodes": env.num_nodes,
        "node_list": env.node_list,
        "handled_events": sorted(handled),
    }
    found = store.save_paths(step, paths, meta)
    ledger.checkpoint_saved(found, final=notice is not None)
    return found


@dataclass
class WaitResult:
    code: int
    what: str
    notice: Notice | None = None
    deadline: str = ""


def wait_for_notice(
    timeout: float | None,
    checkpoint_dir: Path | None = None,
    pid: int | None = None,
    poll: float = 0.5,
    deadline_after_signal: float | None = None,
) -> WaitResult:
    """Block until a notice file for this attempt appears or USR1/TERM arrives (WAIT_NOTICE), ``pid``
    exits (WAIT_PROCESS_ENDED) or ``timeout`` passes (WAIT_TIMEOUT). After a bare signal the deadline
    is ``deadline_after_signal`` seconds later (default: ``[resume]``)."""
    if deadline_after_signal is None:
        deadline_after_signal = job_settings.load().deadline_after_signal
    env = JobEnv.from_environ()
    store_latest = CheckpointStore(checkpoint_dir).latest(verify=False) if checkpoint_dir else None
    handled = _handled(env, LedgerWriter.for_job(env), store_latest)
    got: list[str] = []
    for number in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(number, lambda n, _f: got.append(signal.Signals(n).name))
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        notice = fresh_notice(env, handled)
        if notice is not None:
            return WaitResult(WAIT_NOTICE, f"notice for node {notice.node}", notice, to_text(notice.deadline))
        if got:
            return WaitResult(WAIT_NOTICE, got[0], None, to_text(deadline(utcnow(), deadline_after_signal)))
        if pid is not None and not pid_alive(pid):
            return WaitResult(WAIT_PROCESS_ENDED, f"process {pid} ended")
        if end is not None and time.monotonic() >= end:
            return WaitResult(WAIT_TIMEOUT, f"no notice within {timeout:g} s")
        time.sleep(poll)


def _ignore_sigterm() -> None:
    """Slurm answers a requeue with SIGTERM to every process of the batch step, this one included, before
    or after the request returns: it must neither stop the ledger record nor turn a requeue that Slurm
    took into a failure (exit 143) for the script. Only the main thread may change a signal's handler."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def requeue(checkpoint_dir: Path | None = None) -> tuple[bool, str, int]:
    """Requeue this job, SIGTERM ignored from here on (``_ignore_sigterm``). Returns (ok, message, exit
    code for the shell: 0, or the fallback code)."""
    from slurm_preempt.job.requeue import requeue_self

    env = JobEnv.from_environ()
    ledger = LedgerWriter.for_job(env)
    found = CheckpointStore(checkpoint_dir).latest(verify=False) if checkpoint_dir else None
    # Not _handled(): the final checkpoint just marked this very notice as handled for the next attempt.
    notice = fresh_notice(env, ledger.handled_events())
    events = {notice.event_id} if notice is not None and notice.event_id else set()
    if env.job_id:
        _ignore_sigterm()  # for the rest of this process, which ends once this returns
    outcome = requeue_self(env, ledger, step=found.step if found else None, events=events)
    if outcome.ok:
        return True, outcome.message, 0
    code = job_settings.load().requeue_exit_code
    return False, outcome.message, code if code is not None else EXIT_SLURM


def record_progress(done: int, total: int) -> Path:
    """A ``progress`` ledger event (steps done of the total) for this job: what the watcher's
    ``fallback-deadline`` judges (``watch/deadline.py``). UsageError outside a job or without a ledger."""
    from slurm_preempt.errors import UsageError

    if not 0 <= done <= total or total <= 0:
        raise UsageError(f"progress {done} of {total}: give DONE TOTAL with 0 <= DONE <= TOTAL and TOTAL > 0")
    env = JobEnv.from_environ()
    if not env.job_id or env.state_dir is None:
        raise UsageError("resume progress runs inside a Slurm job with a state folder (SLURM_JOB_ID unset)")
    path = LedgerWriter.for_job(env).record("progress", step=done, total_steps=total)
    if path is None:
        raise UsageError(f"cannot write the ledger under {env.state_dir}")
    return path
