"""Go on without the leaving nodes: shrink a running multi-node job in place at a partial notice.

The batch script of a ``--nodes=MIN-MAX`` job (``slurm-preempt sbatch``) lets its command take the
final checkpoint and end its step as for a requeue, then runs ``slurm-preempt resume shrink``: when the
nodes that leave do not include the batch host and at least MIN nodes stay, the job gives the leaving
nodes back (``scontrol update JobId=J NodeList=<survivors>``) and the script starts the command again on
the survivors, in the same attempt: no requeue, no KillWait, no epilog or prolog, no queue wait, and the
healthy nodes are kept. Otherwise it says why in one line and the script requeues, as without a range.

Slurm facts this relies on (SchedMD/slurm, src/slurmctld/job_mgr.c ``_update_job`` and
``permit_job_shrink``; src/scontrol/update_job.c ``_update_job_size``; tried on 22.05, 24.11, 26.05):

- the owner may shrink a RUNNING job by naming the nodes it keeps; ``NumNodes=N`` would drop nodes in
  bitmap order, so the survivors are named. ``SchedulerParameters=disable_job_shrink`` refuses it;
- the batch host can never be removed ("You cannot remove the batch host from a job when resizing");
- a running step is not resized (only its tasks on a removed node are killed) and 22.05 does not rebuild
  step core bitmaps after a shrink (fixed in 23.02.3): the step has ended before this runs;
- with a step manager (24.05+, ``--stepmgr``; slurmctld then exports ``SLURM_STEPMGR`` to the batch
  script) the step manager is not told of a NodeList shrink: such a job requeues;
- scontrol writes ``slurm_job_J_resize.sh`` into its working folder only when ``SLURM_JOBID`` is set, and
  rewrites only a few variables: it runs here without it, and the new environment is derived here;
- accounting closes the job's row as RESIZING and opens a new one (``sacct -D`` shows both).

Who may shrink what: the script runs as the job's owner and Slurm checks ownership; the watcher and the
hooks (root) never shrink a job. The nodes named come from Slurm's own record of the job (squeue), never
from a file: a notice naming another node leaves the job as it is.

Import-light: standard library only until Slurm must be asked.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from slurm_preempt import ledger
from slurm_preempt.job.environment import ENV_BATCH_HOST, ENV_SCRIPT_DECIDES, JobEnv, fresh_notice, requeue_id
from slurm_preempt.job.ledger_writer import LedgerWriter
from slurm_preempt.notice import GROW_BACK_SOURCE, to_text, utcnow

log = logging.getLogger(__name__)

LEAVING_STATES = "drain,down"  # sinfo -t: DRAIN covers DRAINING and DRAINED
# The variables scontrol's resize script rewrites, and those it unsets "without sufficient information
# to recreate them"; SLURM_HOSTFILE and SLURM_GPUS would still name the old allocation.
UNSET_AFTER_SHRINK = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE", "SLURM_HOSTFILE", "SLURM_GPUS")


@dataclass(frozen=True)
class Decision:
    """Shrink to ``survivors`` (``leaving`` go), or not, and why not (one line)."""

    survivors: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()
    why_not: str = ""

    @property
    def shrink(self) -> bool:
        return not self.why_not


def decide(
    nodes: Sequence[str], leaving: set[str], batch_host: str, min_nodes: int, stepmgr: bool = False
) -> Decision:
    """Whether a job on ``nodes`` may go on without ``leaving`` (only its own nodes count)."""
    gone = tuple(n for n in nodes if n in leaving)
    if not gone:
        return Decision(why_not="no node of this job is leaving (a time-limit warning, or an old notice)")
    if stepmgr:
        return Decision(leaving=gone, why_not="its step manager (--stepmgr) is not told of a shrink")
    if batch_host in gone:
        return Decision(leaving=gone, why_not=f"the batch host {batch_host} is leaving (Slurm keeps it)")
    survivors = tuple(n for n in nodes if n not in leaving)
    if len(survivors) < min_nodes:
        why = f"{len(survivors)} node(s) would stay, fewer than the job's minimum of {min_nodes}"
        return Decision(leaving=gone, why_not=why)
    return Decision(survivors=survivors, leaving=gone)


_CPUS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def cpus_per_node(text: str, old_nodes: Sequence[str], survivors: Sequence[str]) -> str | None:
    """``SLURM_JOB_CPUS_PER_NODE`` (``4(x2),2``, one count per node in the node list's order) for the
    survivors; None when ``text`` does not describe ``old_nodes``."""
    counts: list[int] = []
    for part in text.split(",") if text else []:
        found = _CPUS.fullmatch(part.strip())
        if found is None:
            return None
        counts += [int(found[1])] * int(found[2] or 1)
    if len(counts) != len(old_nodes):
        return None
    kept = [count for node, count in zip(old_nodes, counts, strict=True) if node in set(survivors)]
    groups: list[list[int]] = []
    for count in kept:
        if groups and groups[-1][0] == count:
            groups[-1][1] += 1
        else:
            groups.append([count, 1])
    return ",".join(f"{c}(x{n})" if n > 1 else str(c) for c, n in groups)


def refreshed_env(
    environ: Mapping[str, str], old_nodes: Sequence[str], survivors: Sequence[str]
) -> list[str]:
    """Shell lines that give the batch script the shrunk job's environment."""
    from slurm_preempt.slurm.parse import compress_nodes

    listed = compress_nodes(survivors)
    values = {
        "SLURM_JOB_NODELIST": listed,
        "SLURM_NODELIST": listed,
        "SLURM_JOB_NUM_NODES": str(len(survivors)),
        "SLURM_NNODES": str(len(survivors)),
    }
    cpus = cpus_per_node(environ.get("SLURM_JOB_CPUS_PER_NODE", ""), old_nodes, survivors)
    lines = [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    if cpus is not None:
        lines.append(f"export SLURM_JOB_CPUS_PER_NODE={shlex.quote(cpus)}")
    return lines + [f"unset {name}" for name in UNSET_AFTER_SHRINK if name in environ]


@dataclass
class Outcome:
    """``lines`` to eval when the job shrank; else ``why_not``."""

    shrunk: bool
    why_not: str = ""
    lines: list[str] = field(default_factory=list)
    event: dict = field(default_factory=dict)


def _final_checkpoint(env: JobEnv) -> dict:
    """The newest final checkpoint event of this job (its step and time), if the ledger has one."""
    if env.state_dir is None or not env.job_id:
        return {}
    try:
        saved = [e for e in ledger.events(env.state_dir, env.job_id) if e["kind"] == "checkpoint_saved"]
    except (OSError, ValueError):
        return {}
    finals = [e for e in saved if e.get("final")]
    return finals[-1] if finals else {}


def _slurm(environ: Mapping[str, str]):
    from slurm_preempt.slurm.commands import Slurm

    # scontrol writes resize scripts into its working folder when SLURM_JOBID is set: not wanted here.
    return Slurm(
        timeout=30, env={k: v for k, v in environ.items() if k not in ("SLURM_JOBID", "SLURM_JOB_ID")}
    )


def min_nodes_of(environ: Mapping[str, str]) -> int | None:
    """MIN of the job's node range when its script may shrink it (``ENV_SCRIPT_DECIDES`` holds it)."""
    text = (environ.get(ENV_SCRIPT_DECIDES) or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def would_shrink(environ: Mapping[str, str] | None = None, slurm=None) -> Decision:
    """For the command's writer rank after its final checkpoint: will the script shrink the job? When not,
    the rank requeues the job at once, as it would without a range. Never raises."""
    from slurm_preempt.errors import SlurmPreemptError

    environ = os.environ if environ is None else environ
    min_nodes, env = min_nodes_of(environ), JobEnv.from_environ(environ)
    if min_nodes is None or not env.job_id:
        return Decision(why_not="this job's script does not shrink it")
    try:
        return _plan(env, environ, slurm or _slurm(environ), min_nodes)[1]
    except SlurmPreemptError as exc:
        return Decision(why_not=f"Slurm did not answer: {_first_line(exc)}")


def shrink_in_place(
    min_nodes: int, wait_steps: float = 0.0, environ: Mapping[str, str] | None = None, slurm=None
) -> Outcome:
    """Decide; when the job may shrink, wait up to ``wait_steps`` seconds for its steps to end, then
    shrink, check and record. Never raises for Slurm's answers (an Outcome says why not)."""
    from slurm_preempt.errors import SlurmPreemptError

    environ = os.environ if environ is None else environ
    began = utcnow()
    env = JobEnv.from_environ(environ)
    if not env.job_id:
        return Outcome(False, "not inside a Slurm job")
    slurm = slurm or _slurm(environ)
    try:
        decision = _plan(env, environ, slurm, min_nodes)[1]
        if not decision.shrink:
            return Outcome(False, decision.why_not)
        if not _steps_ended(slurm, requeue_id(env), wait_steps):
            return Outcome(False, f"a step of job {env.job_id} still runs after {wait_steps:g} s")
        return _shrink(env, environ, slurm, min_nodes, began)
    except SlurmPreemptError as exc:
        return Outcome(False, f"the shrink failed: {_first_line(exc)}")


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


STEP_POLL = 0.05  # seconds between two looks at the job's steps


def _steps_ended(slurm, job_id: str, within: float) -> bool:
    """Slurm resizes no running step (and 22.05 would keep its core bitmaps): wait for every numbered
    step to be gone from the controller. Asked of Slurm, not of the srun processes: srun leaves a
    "shepherd" child behind (src/srun/srun_job.c, _shepherd_spawn) that may outlive it by seconds,
    after its step has ended."""
    end = time.monotonic() + within
    while slurm.steps(job_id):
        if time.monotonic() >= end:
            return False
        time.sleep(STEP_POLL)
    return True


def _leaving(env: JobEnv, slurm, nodes: Sequence[str]) -> set[str]:
    notice = fresh_notice(env, set())
    told = {notice.node} if notice is not None else set()
    return told | {n.name for n in slurm.nodes(names=nodes, states=LEAVING_STATES)}


def _plan(env: JobEnv, environ: Mapping[str, str], slurm, min_nodes: int):
    """(the job as Slurm has it now, the decision)."""
    job = slurm.job(requeue_id(env))
    if job is None or not job.running:
        return job, Decision(why_not=f"job {env.job_id} is not running ({job.state if job else 'gone'})")
    notice = fresh_notice(env, set())
    if notice is not None and notice.source == GROW_BACK_SOURCE:
        why = "a grow-back notice: no node is leaving; it requeues to come back larger"
        return job, Decision(why_not=why)
    # The batch script exports its node (SLURMD_NODENAME there) for the command's ranks on other nodes.
    batch_host = environ.get(ENV_BATCH_HOST) or environ.get("SLURMD_NODENAME", "")
    leaving = _leaving(env, slurm, job.nodes)
    return job, decide(job.nodes, leaving, batch_host, min_nodes, stepmgr=bool(environ.get("SLURM_STEPMGR")))


def _shrink(env: JobEnv, environ: Mapping[str, str], slurm, min_nodes: int, began: datetime) -> Outcome:
    job, decision = _plan(env, environ, slurm, min_nodes)
    if not decision.shrink:
        return Outcome(False, decision.why_not)
    from slurm_preempt.slurm.parse import compress_nodes

    slurm.update_job(requeue_id(env), NodeList=compress_nodes(decision.survivors))
    shrunk_at = utcnow()
    after = slurm.job(requeue_id(env))
    if after is None or tuple(after.nodes) != decision.survivors:
        return Outcome(
            False, f"Slurm did not shrink job {env.job_id} to {compress_nodes(decision.survivors)}"
        )
    second = sorted(n.name for n in slurm.nodes(names=after.nodes, states=LEAVING_STATES))
    if second:
        return Outcome(False, f"a second drain ({', '.join(second)}) came during the shrink")
    event = _record(env, job.nodes, decision, began, shrunk_at)
    return Outcome(True, lines=refreshed_env(environ, job.nodes, decision.survivors), event=event)


def _record(
    env: JobEnv, before: Sequence[str], decision: Decision, began: datetime, shrunk_at: datetime
) -> dict:
    from slurm_preempt.slurm.parse import compress_nodes

    final = _final_checkpoint(env)
    notice = fresh_notice(env, set())
    event = {
        "attempt": env.restart_count + 1,
        "nodes_before": compress_nodes(before),
        "nodes_after": compress_nodes(decision.survivors),
        "left": compress_nodes(decision.leaving),
        "num_nodes_before": len(before),
        "nodes": len(decision.survivors),
        "event_id": notice.event_id if notice is not None else "",
        "noticed_at": to_text(notice.detected_at) if notice is not None else "",
        "checkpoint_at": final.get("time", ""),
        "step": final.get("step"),
        "began_at": to_text(began, "milliseconds"),
        "shrunk_at": to_text(shrunk_at, "milliseconds"),
    }
    LedgerWriter.for_job(env).record("shrunk", **event)
    return event
