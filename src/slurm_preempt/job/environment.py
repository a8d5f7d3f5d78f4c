"""What a job learns from its environment, and the ledger it writes to.

Slurm facts (22.05): ``SLURM_JOB_ID`` is an array task's own id, except that one task keeps the array's
id (so requeue names a task as ``ARRAY_TASK``, see ``requeue_id``);
``SLURM_RESTART_COUNT`` is set only after a restart (unset means 0); ``SLURM_JOB_NUM_NODES`` is the node
count of this attempt, which for a ``--nodes=MIN-MAX`` job may differ from the last attempt's; there is
no job start time in the environment, so the start of the batch script process (the oldest ancestor
below slurmstepd) stands in for it.
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

from slurm_preempt import ledger
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


def _int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        text = (env.get(name) or "").strip()
        if text.isdigit():
            return int(text)
    return default


def _stat(pid: int) -> tuple[str, int, float]:
    """(command name, parent pid, start time in clock ticks since boot) of a process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return comm, int(fields[1]), int(fields[19])


def job_start_time() -> datetime | None:
    """When this job attempt started: the start of the oldest ancestor below slurmstepd (the batch
    script), else of this process. UTC; None where /proc is missing."""
    try:
        pid = os.getpid()
        _comm, parent, ticks = _stat(pid)
        first = ticks
        while parent > 1:
            parent_comm, grandparent, parent_ticks = _stat(parent)
            if parent_comm.startswith("slurmstepd"):
                break
            pid, parent, ticks = parent, grandparent, parent_ticks
        else:
            ticks = first  # not under slurmstepd: only this process is known to belong to the attempt
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        started = time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
        return datetime.fromtimestamp(started, timezone.utc)
    except (OSError, ValueError, IndexError):
        return None


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
    start_time: datetime | None = None
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
            done_file=Path(env[ENV_DONE_FILE]) if env.get(ENV_DONE_FILE) else None,
        )


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


STALE_SLACK = 2.0  # seconds: Slurm records drain times to the second


def fresh_notice(env: JobEnv, handled: set[str]) -> Notice | None:
    """The notice for this attempt, or None. The file outlives the attempt it was written for, so a
    notice is stale when an earlier attempt acted on its event (id in ``handled``) or when its drain
    happened before this attempt started (Slurm starts no job on a draining node)."""
    found = read_notice(env.notice_file) if env.notice_file else None
    if found is None or found.event_id in handled:
        return None
    if env.start_time is not None and (env.start_time - found.drain_time).total_seconds() > STALE_SLACK:
        return None
    return found


class LedgerWriter:
    """Ledger events of this job; a missing or unwritable state folder warns once and never raises."""

    def __init__(self, state_dir: Path | None, job_id: str):
        self.state_dir, self.job_id = state_dir, job_id
        self._warned = False

    def record(self, kind: str, **fields) -> Path | None:
        if self.state_dir is None or not self.job_id:
            return None
        try:
            return ledger.record(self.state_dir, self.job_id, kind, source="job", **fields)
        except (OSError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot write the ledger in %s (%s); carrying on without it", self.state_dir, exc)
            return None

    def handled_events(self) -> set[str]:
        """Notice event ids an earlier attempt already acted on (it requeued for them)."""
        if self.state_dir is None or not self.job_id:
            return set()
        try:
            events = ledger.events(self.state_dir, self.job_id)
        except (OSError, ValueError):
            return set()
        return {e["event_id"] for e in events if e.get("kind") == "requeued" and e.get("event_id")}


def ledger_writer(env: JobEnv) -> LedgerWriter:
    return LedgerWriter(env.state_dir, env.job_id)
