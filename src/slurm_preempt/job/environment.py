"""What a job learns from its environment.

Slurm facts (22.05): ``SLURM_JOB_ID`` is an array task's own id, except that one task keeps the array's
id (so requeue names a task as ``ARRAY_TASK``, see ``requeue_id``);
``SLURM_RESTART_COUNT`` is set only after a restart (unset means 0); ``SLURM_JOB_NUM_NODES`` is the node
count of this attempt, which for a ``--nodes=MIN-MAX`` job may differ from the last attempt's.
``SLURM_JOB_START_TIME`` (Slurm 23.02 and later; absent in 22.05) is the attempt's start by the
controller's clock; without it the start of the batch script process (the oldest ancestor below
slurmstepd), by this node's clock, stands in for it.
Import-light: standard library only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from slurm_preempt import procinfo
from slurm_preempt.config import ENV_STATE_DIR
from slurm_preempt.notice import ENV_NOTICE, Notice, notice_path, read_notice

log = logging.getLogger(__name__)

# Exported by scripts from `slurm-preempt sbatch`: the defaults of checkpoint_dir and interval (seconds).
ENV_CHECKPOINT_DIR = "SLURM_PREEMPT_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL = "SLURM_PREEMPT_CHECKPOINT_INTERVAL"
# Exported by scripts from `slurm-preempt sbatch`: the file that says "the command finished its work".
# A notice can land between a program's last step and its exit; the script then must not requeue a job
# that is done, and only the program knows that it is.
ENV_DONE_FILE = "SLURM_PREEMPT_DONE_FILE"
# Exported by the batch script of a job that may shrink in place (``job/shrink.py``), with MIN of its
# node range: after its final checkpoint the command requeues the job only when the script cannot shrink
# it; else it exits and the script shrinks the job. The batch script's node, for ranks elsewhere.
ENV_SCRIPT_DECIDES = "SLURM_PREEMPT_SCRIPT_DECIDES"
# Exported non-empty by the batch script of a job on more than one node: after its final checkpoint the
# command exits and the script requeues the job once the command's steps have ended (``job/requeue.py``).
ENV_SCRIPT_REQUEUES = "SLURM_PREEMPT_SCRIPT_REQUEUES"
ENV_BATCH_HOST = "SLURM_PREEMPT_BATCH_HOST"


def _int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        text = (env.get(name) or "").strip()
        if text.isdigit():
            return int(text)
    return default


def job_start_time() -> datetime | None:
    """When this job attempt started: the start of the oldest ancestor below slurmstepd (the batch
    script), else of this process. UTC; None where /proc is missing."""
    me = procinfo.read(os.getpid())
    if me is None:
        return None
    oldest, parent = me, me.ppid
    while parent > 1:
        above = procinfo.read(parent)
        if above is None:
            return None  # an ancestor exited while we looked: which one was the batch script is unknown
        if above.comm.startswith("slurmstepd"):
            break
        oldest, parent = above, above.ppid
    else:
        oldest = me  # not under slurmstepd: only this process is known to belong to the attempt
    booted = boot_time()
    if booted is None:
        return None
    started = booted + oldest.start_ticks / os.sysconf("SC_CLK_TCK")
    return datetime.fromtimestamp(started, timezone.utc)


def boot_time() -> float | None:
    """When this machine booted, in seconds since the epoch (the clock now less /proc/uptime); None
    where /proc is missing. Start ticks of /proc/PID/stat count from here."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime


@dataclass(frozen=True)
class JobEnv:
    job_id: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    restart_count: int = 0
    num_nodes: int = 1
    node_list: str = ""
    node: str = ""
    rank: int = 0
    world: int = 1
    state_dir: Path | None = None
    notice_file: Path | None = None
    start_time: datetime | None = None  # by this node's clock
    slurm_start_time: datetime | None = None  # by the controller's clock (SLURM_JOB_START_TIME)
    done_file: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        env = os.environ if environ is None else environ
        job_id = env.get("SLURM_JOB_ID", "").strip()
        state_dir = state_dir_of(env)
        notice = env.get(ENV_NOTICE)
        if not notice and state_dir is not None and job_id:
            notice = str(notice_path(state_dir, job_id))
        return cls(
            job_id=job_id,
            array_job_id=env.get("SLURM_ARRAY_JOB_ID", "").strip(),
            array_task_id=env.get("SLURM_ARRAY_TASK_ID", "").strip(),
            restart_count=_int(env, "SLURM_RESTART_COUNT", default=0),
            num_nodes=_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1),
            node_list=env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")),
            node=env.get("SLURMD_NODENAME", ""),
            rank=_int(env, "RANK", "SLURM_PROCID", default=0),
            world=_int(env, "WORLD_SIZE", "SLURM_NTASKS", default=1),
            state_dir=state_dir,
            notice_file=Path(notice) if notice else None,
            start_time=job_start_time(),
            slurm_start_time=_timestamp(env.get("SLURM_JOB_START_TIME")),
            done_file=Path(env[ENV_DONE_FILE]) if env.get(ENV_DONE_FILE) else None,
        )


def _timestamp(text: str | None) -> datetime | None:
    value = (text or "").strip()
    return datetime.fromtimestamp(int(value), timezone.utc) if value.isdigit() else None


def requeue_id(env: JobEnv) -> str:
    """The id that names exactly this job to ``scontrol requeue``. For an array task that is
    ``ARRAY_TASK``: the task Slurm started last keeps the array's own id as its SLURM_JOB_ID (seen on
    22.05: tasks 0,1,2 of array 100 ran as 101, 102 and 100), and ``scontrol requeue 100`` requeues
    every task of the array."""
    if env.array_job_id and env.array_task_id:
        return f"{env.array_job_id}_{env.array_task_id}"
    return env.job_id


def state_dir_of(env: Mapping[str, str]) -> Path | None:
    if env.get(ENV_STATE_DIR):
        return Path(env[ENV_STATE_DIR])
    from slurm_preempt import config

    try:
        return config.load(environ=env).state_dir(env)
    except Exception:  # a broken config must not stop a job from running (settings.load says why)
        log.debug("no state folder from the configuration", exc_info=True)
        return None


# Seconds by which the drain time may precede this attempt's start and the notice still be taken as
# this attempt's: clocks of the controller, a provider and the node disagree (tens of seconds are seen),
# and a provider's event can precede the drain by a watcher poll. A stale notice of the same node is
# older than the node's removal (the grace, 300 s by default) when its job starts there again.
NOTICE_SKEW = 60.0


def fresh_notice(env: JobEnv, handled: set[str]) -> Notice | None:
    """The notice for this attempt, or None. The file outlives the attempt it was written for; by
    identity first, clocks last:

    1. an event an earlier attempt acted on (its id in ``handled``) is stale;
    2. a notice naming the restart count it was written for is this attempt's exactly when that is
       our restart count (lower: an earlier attempt's; higher: our environment lost the count, go on);
    3. otherwise it is stale when its drain precedes this attempt's start by more than NOTICE_SKEW
       (Slurm starts no job on a draining node), the start by Slurm's own clock when Slurm tells it.
    """
    found = read_notice(env.notice_file) if env.notice_file else None
    if found is None or found.event_id in handled:
        return None
    if found.restart_count is not None:
        if found.restart_count == env.restart_count:
            return found
        if found.restart_count < env.restart_count:
            return None
    started = env.slurm_start_time or env.start_time
    if started is not None and (started - found.drain_time).total_seconds() > NOTICE_SKEW:
        return None
    return found
