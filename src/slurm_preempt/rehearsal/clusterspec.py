"""The local test cluster on paper: its shape (``ClusterSpec``), its slurm.conf, and ``cluster.json``.

``cluster.json`` in the cluster's folder holds the spec and every process started for it (pid and
creation time, ``rehearsal/procs.py``): ``testcluster.py`` starts and stops those, and anyone holding a
``ClusterState`` re-reads it before acting, since the drill and tests restart slurmds meanwhile.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_preempt.admin import hooks
from slurm_preempt.durable import write_atomic
from slurm_preempt.errors import ClusterError, UsageError
from slurm_preempt.rehearsal import accounting, versions
from slurm_preempt.rehearsal.procs import Started
from slurm_preempt.slurm.commands import Slurm

DEFAULT_DIR = Path(os.environ.get("SLURM_PREEMPT_TESTCLUSTER_DIR", "/tmp/slurm-preempt-cluster"))
DEFAULT_PORT = 17100
# The benches that start clusters of their own (bench_shrink.py here, bench_simulate.py 40 above,
# bench_watcher.py 100 above, bench_watcher_scale.py 130, bench_pyslurm.py 260) use ports from here on
# unless SP_BENCH_PORT says otherwise: outside the test command's (17300, 100 more per release) so that
# a bench never meets a test session.
BENCH_PORT = 19400
STATE_FILE = "cluster.json"


@dataclass(frozen=True)
class ClusterSpec:
    """The shape of a local cluster."""

    directory: Path = DEFAULT_DIR
    standard: int = 2
    preemptible: int = 4
    cpus: int = 8  # declared per node; may exceed the host's (config_overrides)
    memory_mb: int = 4000
    port: int = DEFAULT_PORT  # slurmctld; nodes take the following ports
    name: str = "sptest"
    kill_wait: int = 5  # seconds from SIGTERM to SIGKILL (Slurm's default is 30)
    extra_conf: tuple[str, ...] = ()  # lines appended to slurm.conf (hooks, accounting)
    hooks: bool = False  # install the prolog/epilog hooks under <dir>/etc (slurm_preempt.admin.hooks)
    accounting: bool = False  # run MariaDB + slurmdbd (slurm_preempt.rehearsal.accounting) so sacct answers
    slurm: str = versions.SYSTEM  # which Slurm release runs it (rehearsal.versions.RELEASES)

    def validate(self) -> None:
        if self.standard < 0 or self.preemptible < 0:
            raise UsageError("node counts cannot be negative")
        if self.standard + self.preemptible == 0:
            raise UsageError("a cluster needs at least one node")
        if self.standard + self.preemptible > 64:
            raise UsageError("at most 64 nodes on one host")
        if self.cpus < 1 or self.memory_mb < 100:
            raise UsageError("each node needs at least 1 CPU and 100 MB")
        if not 1024 < self.port < 65535 - self.standard - self.preemptible:
            raise UsageError(f"port {self.port} is out of range (1025-65000)")
        if self.directory.exists() and not self.directory.is_dir():
            raise UsageError(f"--dir {self.directory} exists and is not a folder")
        versions.release(self.slurm)

    @property
    def node_names(self) -> list[str]:
        std = [f"std{i}" for i in range(1, self.standard + 1)]
        pre = [f"pre{i}" for i in range(1, self.preemptible + 1)]
        return std + pre

    @property
    def conf_path(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def state_dir(self) -> Path:
        """slurm-preempt's own state (notices, ledger) for jobs of this cluster."""
        return self.directory / "sp-state"

    @property
    def munge_socket(self) -> Path:
        return self.directory / "munge" / "munge.socket"

    def to_json(self) -> dict:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["extra_conf"] = list(self.extra_conf)
        return data

    @classmethod
    def from_json(cls, data: dict) -> ClusterSpec:
        data = dict(data)
        data["directory"] = Path(data["directory"])
        data["extra_conf"] = tuple(data.get("extra_conf", ()))
        return cls(**data)


@dataclass
class ClusterState:
    """What ``cluster.json`` holds: the spec and the processes started for it."""

    spec: ClusterSpec
    processes: list[Started] = field(default_factory=list)
    started_at: float = 0.0
    ready_seconds: float = 0.0

    def alive(self) -> list[Started]:
        return [p for p in self.processes if p.alive]

    def env(self) -> dict[str, str]:
        """What points Slurm commands at this cluster (PATH too when it runs another release)."""
        client = versions.client_env(self.spec.slurm, self.spec.directory, os.environ.get("PATH", ""))
        return {
            "SLURM_CONF": str(self.spec.conf_path),
            "SLURM_PREEMPT_STATE_DIR": str(self.spec.state_dir),
            **client,
        }

    def slurm(self, timeout: float = 10.0) -> Slurm:
        """The Slurm client of this cluster: its commands, pointed at it by ``env()``. Stateless, so
        cheap; ``timeout`` short by default, since a test cluster's controller answers at once or not
        at all."""
        return Slurm(env={**os.environ, **self.env()}, timeout=timeout)


def render_conf(spec: ClusterSpec, first_job_id: int, release_lines: Sequence[str] = ()) -> str:
    """slurm.conf for ``spec``."""
    d = spec.directory
    lines = [
        f"ClusterName={spec.name}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={spec.port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={spec.munge_socket}",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        # linuxproc needs no cgroup setup, which sandboxes and containers rarely allow.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        # A node set DOWN (removed) comes back only when resumed. With 2, Slurm 24.11+ brings a node back
        # by itself when a reply it sent just before the removal is processed (they queue up to 2 s).
        "ReturnToService=1",
        "MpiDefault=none",
        f"KillWait={spec.kill_wait}",
        # Job ids go on rising across fresh starts, so ledgers of earlier runs never collide.
        f"FirstJobId={first_job_id}",
        *release_lines,
    ]
    port = spec.port + 1
    for feature, prefix, count in (
        ("standard", "std", spec.standard),
        ("preemptible", "pre", spec.preemptible),
    ):
        if count == 0:
            continue
        lines.append(
            f"NodeName={prefix}[1-{count}] NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"Port={port}-{port + count - 1} CPUs={spec.cpus} RealMemory={spec.memory_mb} "
            f"Features={feature} State=UNKNOWN"
        )
        port += count
    lines.append("PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    if spec.hooks:
        lines.extend(hooks.conf_lines(d / "etc"))
    if spec.accounting:
        lines.extend(accounting.conf_lines(spec))
    lines.extend(spec.extra_conf)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- state file


def load_state(directory: Path) -> ClusterState | None:
    """The cluster ``up`` left in ``directory``; None when there is none."""
    path = directory / STATE_FILE
    try:
        data = json.loads(path.read_text())
        return ClusterState(
            spec=ClusterSpec.from_json(data["spec"]),
            processes=[Started.from_json(p) for p in data.get("processes", [])],
            started_at=data.get("started_at", 0.0),
            ready_seconds=data.get("ready_seconds", 0.0),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        problem = f"{type(exc).__name__}: {exc}" if isinstance(exc, (KeyError, TypeError)) else str(exc)
        raise ClusterError(f"{path} is unreadable ({problem}); remove the folder and start again") from None


def save_state(state: ClusterState) -> None:
    """Written after every process started, so ``down`` finds even a half-started cluster."""
    payload = {
        "spec": state.spec.to_json(),
        "processes": [p.to_json() for p in state.processes],
        "started_at": state.started_at,
        "ready_seconds": state.ready_seconds,
    }
    write_atomic(state.spec.directory / STATE_FILE, json.dumps(payload, indent=1))


def env_lines(state: ClusterState) -> list[str]:
    """``export`` lines for a shell; PATH keeps the shell's own after the release's commands."""
    env = state.env()
    quoted = {key: shlex.quote(value) for key, value in env.items()}
    if "PATH" in env:
        quoted["PATH"] = f'{shlex.quote(env["PATH"].split(":", 1)[0])}:"$PATH"'
    return [f"export {key}={value}" for key, value in quoted.items()]
