"""One job's attempts, told from the restart ledger and, when accounting exists, ``sacct -D``.

An attempt is one run of the job between a start and an end; its number is Slurm's restart count.
The prolog writes ``attempt_start`` on every node, the controller's EpilogSlurmctld the authoritative
``attempt_end``, the node epilog a node-side ``attempt_end``. Why an attempt ended:

- with accounting, ``sacct -D`` says it: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED,
  REQUEUED;
- from the ledger alone (Slurm 22.05 gives the epilog no job state): a later attempt means the job
  was requeued; if no node epilog ran for it, its node vanished (node failure: preemption); otherwise
  the exit code tells failed from ended. A completed, a cancelled and a timed-out job all end 0:0
  there, so the ledger alone says "completed, cancelled or timed out".

What an attempt holds and how work lost is counted: ``records/attempts.py``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from slurm_preempt import ledger
from slurm_preempt.errors import UsageError
from slurm_preempt.notice import from_text
from slurm_preempt.records import shrinks
from slurm_preempt.records.attempts import ACCT_CAUSES, ENDED_ZERO, Attempt, JobHistory, clock_text
from slurm_preempt.records.leadtime import NOTICE_SOURCES
from slurm_preempt.slurm.parse import expand_nodes
from slurm_preempt.slurm.sacct import AcctRecord


def build(
    job_id: str, events: list[dict], acct: list[AcctRecord] | None = None, ignored: int = 0
) -> JobHistory:
    """Pure: attempts from trusted ledger events and (optionally) sacct -D rows of this job."""
    history = JobHistory(job_id=str(job_id), accounting=acct is not None, ignored_events=ignored)
    for event in events:
        who = _by(event)
        history.events_by[who] = history.events_by.get(who, 0) + 1
    by_number: dict[int, Attempt] = {}
    for event in events:
        if event["kind"] in ("attempt_start", "attempt_end"):
            history.ignored_events += not _applied(_apply_hook_event, history, by_number, event)
    attempts = sorted(by_number.values(), key=lambda a: a.number)
    if acct:
        attempts = _merge_acct(history, attempts, acct)
    for event in events:
        history.ignored_events += not _applied(_apply_job_event, history, attempts, event)
        if event["kind"] == "grow_back":
            history.ignored_events += not _applied(_add_grow_back, history, attempts, event)
        if event["kind"] in ("launch_held", "fallback"):
            add = _add_launch_held if event["kind"] == "launch_held" else _add_move
            history.ignored_events += not _applied(add, history, attempts, event)
    _finish(attempts)
    history.attempts = attempts
    return history


def _applied(apply, history: JobHistory, attempts, event: dict) -> bool:
    """Apply one event; False (counted as ignored, the rest of the job kept) when its values are not
    what the ledger writes: a job's own events are its user's text (a node list of a billion names, a
    time in year 9999)."""
    try:
        apply(history, attempts, event)
    except (ValueError, TypeError, OverflowError, KeyError, UsageError):
        return False
    return True


def _by(event: dict) -> str:
    """Who wrote the event, from its file's owner (root, writer, owner); "" for one not read from disk."""
    return ledger.written_by(event) if "_uid" in event else ""


def _add_launch_held(history: JobHistory, _attempts, event: dict) -> None:
    """The watcher's ``launch_held`` event (watch/launchhold.py) as a warning line."""
    moment = _time(event)
    when = moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "?"
    why = "launch failed, held"
    if event.get("limit") is True:
        why = "held by Slurm after MaxBatchRequeue failed launches"
    if event.get("released") is not True:
        history.warnings.append(f"{when} {why}: left held (released once before, or only an operator may)")
        return
    fallback = event.get("fallback")
    # A sidecar's events come from the job's owner: show only a constraint-like word.
    shown = isinstance(fallback, str) and _CONSTRAINT.fullmatch(fallback)
    where = f"moved to {fallback}, " if shown else ""
    by = "by the watcher" if _by(event) in ("root", "writer", "") else "(the job's owner says so)"
    history.warnings.append(f"{when} {why}: {where}released {by}")


def _add_grow_back(_history: JobHistory, attempts: list[Attempt], event: dict) -> None:
    moment = _time(event)
    attempt = _attempt_at(attempts, moment) if moment is not None else None
    if attempt is not None:
        attempt.grown = shrinks.grown(event)


def _add_move(history: JobHistory, _attempts, event: dict) -> None:
    """The watcher's ``fallback`` event: where the job went and why (printable text, bounded)."""
    moment, after, why = _time(event), event.get("after"), str(event.get("why", ""))
    where = after if isinstance(after, str) and _CONSTRAINT.fullmatch(after) else "its fallback nodes"
    reason = "".join(ch for ch in why if ch.isprintable())[:300]
    history.moves.append(f"{clock_text(moment)} moved to {where}: {reason}")


_CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|!-]{1,64}")


def _time(event: dict, key: str = "time") -> datetime | None:
    """The event's time; for ``time`` the ledger's order (``ledger._order``: the nanoseconds of the file
    name when they agree with the content, the text having whole seconds)."""
    if key == "time" and event.get("_order"):
        return datetime.fromtimestamp(event["_order"] / 1e9, tz=timezone.utc)
    try:
        return from_text(str(event[key]))
    except (KeyError, ValueError, OverflowError):
        return None


def _int(value, default: int = 0) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        return default


def _cpus(per_node: str) -> int:
    """``SLURM_JOB_CPUS_PER_NODE`` (``4(x2),2``) -> total CPUs."""
    total = 0
    for part in str(per_node or "").split(","):
        count, _, times = part.partition("(x")
        total += _int(count) * (_int(times.rstrip(")"), 1) if times else 1)
    return total


def _end_number(by_number: dict[int, Attempt], number: int, event: dict) -> int:
    """The attempt an ``attempt_end`` belongs to (events arrive in time order).

    After ``scontrol requeue`` Slurm raises the restart count before the epilogs run, so the end of
    attempt N arrives saying N+1. An end of N+1 before N+1 started, on N's nodes, is N's, unless N
    already has that end: a node failure leaves the count as it was, and an attempt relaunched on a
    node whose slurmd restarted on its spool runs without a prolog (slurmd still knows the job id),
    so N+1 may have ended with no start recorded.
    """
    current, previous = by_number.get(number), by_number.get(number - 1)
    started = current is not None and current.start is not None
    if number == 0 or started or previous is None or previous.start is None:
        return number
    if event.get("hook") == "epilog":
        if str(event.get("node", "")) in previous.node_epilogs:
            return number
    elif previous.controller_ended:
        return number
    nodes = set(expand_nodes(str(event.get("nodes", "")))) if event.get("nodes") else set()
    return number - 1 if nodes and nodes <= set(previous.nodes) else number


def _apply_hook_event(history: JobHistory, by_number: dict[int, Attempt], event: dict) -> None:
    number = _int(event.get("restart_count", 0))
    if event["kind"] == "attempt_end":
        number = _end_number(by_number, number, event)
    attempt = by_number.setdefault(number, Attempt(number))
    moment = _time(event)
    history.user = history.user or str(event.get("user", ""))
    history.partition = history.partition or str(event.get("partition", ""))
    if event["kind"] == "attempt_start":
        history.constraints = history.constraints or str(event.get("constraints", ""))
        if moment and (attempt.start is None or moment < attempt.start):
            attempt.start = moment
        node = str(event.get("node", ""))
        if node and node not in attempt.nodes:
            attempt.nodes.append(node)
            attempt.gpus += len([g for g in str(event.get("gpus", "")).split(",") if g.strip()])
        attempt.cpus = attempt.cpus or _cpus(event.get("cpus_per_node", ""))
        if not attempt.nodes and event.get("nodes"):
            attempt.nodes = expand_nodes(str(event["nodes"]))
        return
    if event.get("hook") == "epilog":
        if moment:
            attempt.node_epilogs[str(event.get("node", ""))] = moment
        if attempt.end is None and moment:
            attempt.end = moment
    else:  # the controller's end is the authority
        attempt.end = moment or attempt.end
        attempt.controller_ended = True
    attempt.exit_code = str(event.get("exit_code", attempt.exit_code))
    if not attempt.nodes and event.get("nodes"):
        attempt.nodes = expand_nodes(str(event["nodes"]))


def _merge_acct(history: JobHistory, attempts: list[Attempt], rows: list[AcctRecord]) -> list[Attempt]:
    """sacct -D rows are the attempts in order; pair them with ledger attempts by start time."""
    started = shrinks.fold_resizes(rows)
    merged = []
    unmatched = list(attempts)
    for index, (start, row) in enumerate(started):
        match = _pair(unmatched, index, start)
        attempt = match or Attempt(number=index, source="sacct")
        if match is not None:
            unmatched.remove(match)
            attempt.source = "ledger+sacct"
        attempt.start = attempt.start or start
        attempt.end = attempt.end or row.end  # the hooks' times have nanoseconds, sacct's whole seconds
        attempt.nodes = attempt.nodes or list(row.nodes)
        attempt.exit_code = row.exit_code or attempt.exit_code
        attempt.cpus = row.cpus or attempt.cpus
        attempt.gpus = row.gpus or attempt.gpus
        attempt.cause = ACCT_CAUSES.get(row.state, (row.state.lower(), False))[0]
        if row.state == "RUNNING":
            attempt.cause, attempt.end = "running", None
        history.submit = history.submit or row.submit
        history.user = history.user or row.user
        history.partition = history.partition or row.partition
        history.constraints = history.constraints or row.constraints
        merged.append(attempt)
    merged += unmatched
    return sorted(merged, key=lambda a: (a.start is None, a.start or datetime.max, a.number))


def _pair(attempts: list[Attempt], index: int, start: datetime) -> Attempt | None:
    """The ledger attempt of the sacct row that started at ``start``: the same restart number (rows in
    order are restarts 0, 1, ...) unless its start is far off, else the one that started closest,
    within two minutes."""

    def gap(a: Attempt) -> float:
        return 0.0 if a.start is None else abs((a.start - start).total_seconds())

    same = next((a for a in attempts if a.number == index and gap(a) <= 120), None)
    if same is not None:
        return same
    close = [a for a in attempts if a.start is not None and gap(a) <= 120]
    return min(close, key=gap, default=None)


def _apply_job_event(history: JobHistory, attempts: list[Attempt], event: dict) -> None:
    kind, moment = event["kind"], _time(event)
    if moment is None or kind not in (
        "notice_sent",
        "checkpoint_saved",
        "requeued",
        "shrunk",
        "resumed_from",
        "checkpoint_interval",
    ):
        return
    attempt = _attempt_at(attempts, moment)
    if attempt is None:
        return
    if kind in ("shrunk", "resumed_from"):
        shrinks.apply(attempt, event, moment)
        return
    if kind == "notice_sent":
        drain = str(event.get("event_id", "")).partition("@")[2]
        attempt.notice_by = attempt.notice_by if attempt.notice_time else _by(event)
        attempt.notice_time = attempt.notice_time or (_safe_time(drain) or moment)
        attempt.deadline = attempt.deadline or _time(event, "deadline")
        if attempt.notice_given is None:
            attempt.notice_given = moment
            source = event.get("source_kind")
            attempt.notice_source = source if source in NOTICE_SOURCES else "other"
    elif kind == "checkpoint_saved":
        attempt.checkpoints.append(moment)
        if event.get("final") is True:
            attempt.final_checkpoints.append(moment)
        if isinstance(event.get("seconds"), (int, float)):
            history.checkpoint_seconds.append(float(event["seconds"]))
    elif kind == "checkpoint_interval":
        seconds = event.get("seconds")
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 < seconds < 1e7:
            attempt.intervals.append(float(seconds))
    elif kind == "requeued":
        attempt.cause = "requeued after notice" if attempt.notice_time else "requeued by the job"


def _safe_time(text: str) -> datetime | None:
    try:
        return from_text(text) if text else None
    except (ValueError, OverflowError):
        return None


def _attempt_at(attempts: list[Attempt], moment: datetime) -> Attempt | None:
    """The attempt running at ``moment`` (the last one started at or before it)."""
    started = [a for a in attempts if a.start is not None and a.start <= moment]
    return started[-1] if started else None


def _finish(attempts: list[Attempt]) -> None:
    for index, attempt in enumerate(attempts):
        attempt.checkpoints.sort()
        later = attempts[index + 1] if index + 1 < len(attempts) else None
        if attempt.source == "ledger" and attempt.cause == "running":
            attempt.cause = _ledger_cause(attempt, later)
        if attempt.cause == "requeued" and attempt.notice_time:
            attempt.cause = "requeued after notice"
        if attempt.grown and attempt.cause.startswith("requeued"):
            attempt.cause = attempt.grown  # no preemption: the job left to come back on more nodes
        if later is not None and attempt.end and later.start:
            later.wait_before = max(0.0, (later.start - attempt.end).total_seconds())


def _ledger_cause(attempt: Attempt, later: Attempt | None) -> str:
    if attempt.end is None:
        return "running" if later is None else "ended (no end recorded)"
    if later is not None:
        # A vanished node's slurmd runs the epilog late, when the node comes back: only an epilog that
        # ran before the next attempt started shows that the node was alive at the end.
        timely = [t for t in attempt.node_epilogs.values() if later.start is None or t <= later.start]
        if not timely:
            return "node failure (preempted)"
        return "requeued after notice" if attempt.notice_time else "requeued"
    code, _, sig = attempt.exit_code.partition(":")
    if _int(sig):
        return f"killed by signal {_int(sig)}"
    if _int(code):
        return f"failed (exit {_int(code)})"
    return ENDED_ZERO


def load(job_id: str, state_dir: Path | str, slurm=None) -> JobHistory:
    """Read the ledger (trusted events only) and, when ``slurm`` is given and accounting answers, sacct."""
    rows = accounting_rows(slurm, [job_id]) if slurm is not None else None
    return from_ledger(job_id, state_dir, None if rows is None else rows.get(str(job_id), []))


def from_ledger(job_id: str, state_dir: Path | str, acct: list[AcctRecord] | None = None) -> JobHistory:
    every = ledger.events(state_dir, job_id)
    trusted = ledger.trusted_events(state_dir, job_id)
    return build(job_id, trusted, acct, ignored=len(every) - len(trusted))


def accounting_rows(slurm, job_ids: list[str], chunk: int = 500) -> dict[str, list[AcctRecord]] | None:
    """sacct -D rows by job id, or None when accounting is not there (sacct fails without slurmdbd)."""
    from slurm_preempt.errors import SlurmError

    found: dict[str, list[AcctRecord]] = {}
    try:
        for first in range(0, len(job_ids), chunk):
            for row in slurm.accounting([str(j) for j in job_ids[first : first + chunk]]):
                found.setdefault(row.job_id, []).append(row)
    except SlurmError:
        return None
    return found


def run_history(
    job_id: str, state_dir: Path | str | None = None, use_sacct: bool = True, slurm=None
) -> JobHistory:
    """What ``slurm-preempt history`` shows: state folder from the option, env or config. ``A_T`` (an
    array task) is looked up first: its ledger is filed under the task's own job id."""
    from slurm_preempt import config
    from slurm_preempt.errors import UsageError
    from slurm_preempt.slurm.commands import Slurm

    folder = Path(state_dir) if state_dir else config.load().state_dir()
    slurm = slurm or Slurm()
    if "_" in job_id:
        task = job_id
        job_id = task_job_id(task, slurm, use_sacct) or ""
        if not job_id:
            raise UsageError(
                f"cannot tell which job array task {task} is: Slurm no longer shows it and accounting does "
                "not answer; give the task's own job id (JobIDRaw in sacct, JobId in its output file)"
            )
    found = load(job_id, folder, slurm if use_sacct else None)
    if not found.attempts:
        raise UsageError(f"no attempt of job {job_id} recorded in {folder} (are the hooks installed?)")
    return found


def task_job_id(task: str, slurm, use_sacct: bool = True) -> str | None:
    """The job id of array task ``A_T`` (the hooks and the watcher file its ledger under that id): from
    squeue while Slurm shows the job, else from sacct."""
    from slurm_preempt.errors import SlurmError

    try:
        job = slurm.job(task)
        if job is not None and job.display_id == task:
            return job.job_id
        rows = slurm.accounting([task]) if use_sacct else []
    except SlurmError:
        return None
    return next((row.job_id for row in rows if row.display_id == task), None)
