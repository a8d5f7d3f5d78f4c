"""A real multi-node Slurm cluster on this one host, from Debian's packages, for demos and tests.

By default it runs the host's Slurm; ``slurm="24.11"`` or ``"26.05"`` runs that release from a Debian
root built once in a cache folder (``versions``, ``slurmroot``).

One munged, one slurmctld and one ``slurmd -N NAME`` per node, all as root, every file (config, munge
key and socket, state, spool, logs) under one folder, on ports of its own so it never meets a real
Slurm. Nodes carry the features ``standard`` or ``preemptible`` and may declare more CPUs than the
host has (``SlurmdParameters=config_overrides``), so many small jobs fit.

Each daemon is started in the foreground of its own session and remembered by pid and creation time
in ``cluster.json``; ``down`` stops exactly those. Each slurmd is started with
``SP_TESTCLUSTER_NODE=<name>`` in its environment, which its slurmstepd processes inherit: that is how
``remove_node`` finds a node's job processes to kill them as a vanishing machine would.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_preempt.errors import ClusterError, UsageError
from slurm_preempt.records import hooks
from slurm_preempt.rehearsal import accounting, procs, versions
from slurm_preempt.rehearsal.procs import Started
from slurm_preempt.slurm.commands import Slurm

DEFAULT_DIR = Path(os.environ.get("SLURM_PREEMPT_TESTCLUSTER_DIR", "/tmp/slurm-preempt-cluster"))
DEFAULT_PORT = 17100
STATE_FILE = "cluster.json"
SYSTEM_PATH = versions.SYSTEM_PATH

Progress = Callable[[str], None]


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
    hooks: bool = False  # install the prolog/epilog hooks under <dir>/etc (slurm_preempt.records.hooks)
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


def check_packages(slurm: str = versions.SYSTEM) -> None:
    """Raise MissingDependencyError naming what to install (for another release: build its root)."""
    versions.runtime(slurm).check()


# ---------------------------------------------------------------------------------------- state file


def load_state(directory: Path) -> ClusterState | None:
    path = directory / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{path} is unreadable ({exc}); remove the folder and start again") from None
    return ClusterState(
        spec=ClusterSpec.from_json(data["spec"]),
        processes=[Started.from_json(p) for p in data.get("processes", [])],
        started_at=data.get("started_at", 0.0),
        ready_seconds=data.get("ready_seconds", 0.0),
    )


def save_state(state: ClusterState) -> None:
    path = state.spec.directory / STATE_FILE
    tmp = path.with_suffix(".tmp")
    payload = {
        "spec": state.spec.to_json(),
        "processes": [p.to_json() for p in state.processes],
        "started_at": state.started_at,
        "ready_seconds": state.ready_seconds,
    }
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------- up / down


def up(spec: ClusterSpec, timeout: float = 90.0, progress: Progress = lambda _: None) -> ClusterState:
    """Start the cluster (or find it already running) and wait until every node is idle."""
    spec.validate()
    if os.geteuid() != 0:
        raise ClusterError("the test cluster runs slurmd, which needs root: run it as root")
    existing = load_state(spec.directory) if spec.directory.is_dir() else None
    if existing is not None:
        if existing.processes and all(p.alive for p in existing.processes):
            if existing.spec != spec:
                raise ClusterError(
                    f"a cluster of another shape already runs in {spec.directory}: "
                    "run `slurm-preempt testcluster down` first"
                )
            progress(f"already up in {spec.directory}")
            return existing
        if existing.alive():
            progress("found a half-running cluster from an earlier run: stopping it")
            _stop_all(existing)
    elif spec.directory.is_dir() and any(spec.directory.iterdir()):
        raise ClusterError(f"{spec.directory} is not empty and holds no test cluster: choose another --dir")
    return _start(spec, timeout, progress)


def _prepare_dirs(spec: ClusterSpec) -> None:
    d = spec.directory
    for sub in ("etc", "log", "run", "spool", "munge"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    # Fresh controller state each start: a crashed run's jobs must not come back to life.
    shutil.rmtree(d / "state", ignore_errors=True)
    (d / "state").mkdir()
    for name in spec.node_names:
        (d / "spool" / name).mkdir(exist_ok=True)
    for sub in ("notices", "jobs"):
        (spec.state_dir / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o755)  # jobs of other users need to reach the munge socket and the config
    os.chmod(d / "munge", 0o755)  # munged refuses a socket folder that others can write
    key = d / "munge" / "munge.key"
    if not key.exists():
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(1024))


def _check_ports(spec: ClusterSpec) -> None:
    """Fail early, in one line, when another cluster (or anything else) holds our ports."""
    import socket

    for port in range(spec.port, spec.port + len(spec.node_names) + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                raise ClusterError(
                    f"port {port} is in use (another test cluster?): choose another --port, or stop "
                    "the other one with `slurm-preempt testcluster down --dir ...`"
                ) from None


def _start(spec: ClusterSpec, timeout: float, progress: Progress) -> ClusterState:
    runtime = versions.runtime(spec.slurm)
    runtime.check()  # builds the release's root the first time
    began = time.monotonic()
    _check_ports(spec)
    _prepare_dirs(spec)
    d = spec.directory
    runtime.prepare_clients(d)
    first_job_id = 1000 + int(time.time() // 2) % 30_000_000
    spec.conf_path.write_text(render_conf(spec, first_job_id, runtime.conf_lines()))
    if spec.hooks:  # the same code path as `slurm-preempt hooks install`
        hooks.install(d / "etc", spec.state_dir)
    state = ClusterState(spec=spec, started_at=time.time())
    env = {"PATH": SYSTEM_PATH, "SLURM_CONF": str(spec.conf_path), "SP_TESTCLUSTER_DIR": str(d)}
    try:
        progress("starting munged")
        sock = spec.munge_socket
        state.processes.append(
            procs.start(
                "munged",
                runtime.daemon_argv(
                    "munged",
                    [
                        "-F",
                        "--force",
                        f"--socket={sock}",
                        f"--key-file={d}/munge/munge.key",
                        f"--log-file={d}/log/munged.log",
                        f"--pid-file={d}/munge/munged.pid",
                        f"--seed-file={d}/munge/munged.seed",
                    ],
                    [d],
                ),
                env,
                d / "log" / "munged.out",
            )
        )
        save_state(state)
        _await(lambda: sock.exists(), 10, "munged did not create its socket", state)
        if spec.accounting:  # slurmctld registers with slurmdbd when it starts
            state.processes += accounting.start(spec, env, progress)
            save_state(state)
        progress("starting slurmctld")
        slurmctld = runtime.daemon_argv("slurmctld", ["-D"], [d])
        state.processes.append(procs.start("slurmctld", slurmctld, env, d / "log" / "slurmctld.out"))
        save_state(state)
        slurm = Slurm(env={**os.environ, **state.env()}, timeout=10)
        _await(slurm.ping, 30, "slurmctld did not answer", state)
        progress(f"starting {len(spec.node_names)} slurmd: {', '.join(spec.node_names)}")
        for name in spec.node_names:
            state.processes.append(_start_slurmd(state, name, env))
        save_state(state)
        _await(lambda: _all_idle(slurm, spec), timeout, "nodes did not all become idle", state)
    except BaseException:
        _stop_all(state)
        raise
    state.ready_seconds = round(time.monotonic() - began, 2)
    save_state(state)
    progress(f"{len(spec.node_names)} nodes idle after {state.ready_seconds:.1f} s")
    return state


def _start_slurmd(state: ClusterState, name: str, env: dict[str, str]) -> Started:
    d = state.spec.directory
    return procs.start(
        f"slurmd:{name}",
        versions.runtime(state.spec.slurm).daemon_argv("slurmd", ["-D", "-N", name], [d]),
        {**env, "SP_TESTCLUSTER_NODE": name},
        d / "log" / f"slurmd-{name}.out",
    )


def _await(predicate, timeout: float, what: str, state: ClusterState) -> None:
    if procs.wait_until(predicate, timeout, 0.2):
        return
    dead = [p.role for p in state.processes if not p.alive]
    hint = f" ({', '.join(dead)} exited)" if dead else ""
    raise ClusterError(f"{what} within {timeout:g} s{hint}; see {state.spec.directory}/log/")


def _all_idle(slurm: Slurm, spec: ClusterSpec) -> bool:
    try:
        nodes = slurm.nodes()
    except Exception:
        return False
    idle = {n.name for n in nodes if n.state == "IDLE" and n.available}
    return idle >= set(spec.node_names)


def down(directory: Path = DEFAULT_DIR, progress: Progress = lambda _: None) -> int:
    """Stop what ``up`` started in ``directory`` and every job process left on its nodes.

    Returns how many processes were stopped (0 when nothing ran).
    """
    state = load_state(directory)
    if state is None:
        progress(f"no test cluster in {directory}")
        return 0
    if state.alive():
        _cancel_jobs(state)
    count = _stop_all(state)
    state.processes = []
    save_state(state)
    progress(f"stopped {count} processes")
    return count


def _cancel_jobs(state: ClusterState) -> None:
    slurm = Slurm(env={**os.environ, **state.env()}, timeout=10)
    try:
        ids = [j.job_id for j in slurm.jobs()]
        if ids:
            slurm.run(["scancel", *ids])
            procs.wait_until(lambda: not slurm.jobs(states="running,completing"), 10, 0.3)
    except Exception:  # a dead controller must not stop us from stopping the rest
        pass


def _stop_all(state: ClusterState) -> int:
    live = [(s.role, s.process()) for s in state.processes]
    slurm_daemons = [p for role, p in live if p is not None and role != "munged"]
    munge = [p for role, p in live if p is not None and role == "munged"]
    # Daemons this folder started but no longer lists (a crash between start and save): found by the
    # tag in their environment, which slurmd and slurmctld keep (slurmstepd does not).
    known = {p.pid for p in slurm_daemons + munge}
    tagged = procs.with_env("SP_TESTCLUSTER_DIR", str(state.spec.directory))
    slurm_daemons += [p for p in tagged if p.pid not in known and p.name() != "slurmstepd"]
    # Job steps left behind: every slurmstepd listening in this cluster's spool, and its children.
    ours = {p.pid for p in slurm_daemons + munge}
    steps = procs.listening_under("slurmstepd", state.spec.directory / "spool")
    leftovers = [p for p in procs.tree(steps) if p.pid not in ours]
    procs.stop(slurm_daemons, grace=10)
    procs.kill_now(leftovers)
    procs.stop(munge, grace=5)  # last: slurmd and slurmctld talk to it while they stop
    return len(slurm_daemons) + len(munge) + len(leftovers)


# ---------------------------------------------------------------------------------------- node removal


def remove_node(state: ClusterState, name: str, reason: str = "removed") -> int:
    """Make node ``name`` vanish as a reclaimed machine does: nothing gets a SIGTERM.

    SIGKILL its slurmd first (so it can neither report nor deliver signals), then its slurmstepd and
    job processes, then mark it DOWN: a ``--requeue`` job ends NODE_FAIL and is requeued. (Killing the
    job while slurmd lives ends it FAILED and not requeued; setting DOWN while slurmd lives gives a
    SIGTERM and KillWait that a real removal never gives.) Returns how many processes were killed.
    """
    # Only this cluster's slurmd: clusters of other test sessions run on this host with the same node names.
    slurmd = [
        p
        for p in procs.with_env("SP_TESTCLUSTER_NODE", name)
        if _env_of(p).get("SP_TESTCLUSTER_DIR") == str(state.spec.directory)
    ]
    namespaces = {ns for ns in map(procs.mount_namespace, slurmd) if ns and ns != procs.mount_namespace()}
    killed = procs.kill_now(slurmd)
    # A job that just started may have a slurmstepd forked but not yet listening: look twice. On another
    # release each node runs in a mount namespace of its own, which holds exactly its processes.
    for _ in range(2):
        steps = procs.tree(procs.listening_under("slurmstepd", state.spec.directory / "spool" / name))
        killed += procs.kill_now(steps) + procs.kill_now(procs.in_mount_namespaces(namespaces))
        time.sleep(0.2)
    Slurm(env={**os.environ, **state.env()}).set_down([name], reason)
    return killed


def _env_of(proc) -> dict:
    try:
        return proc.environ()
    except Exception:  # gone or not ours to read
        return {}


def revive_node(state: ClusterState, name: str, timeout: float = 30.0) -> None:
    """Bring a removed node back: start its slurmd again and resume it."""
    # Re-read cluster.json: another holder of a ClusterState (the drill, a test) may have restarted
    # slurmds since this copy was loaded, and a stale copy would start a second slurmd for the node.
    state = load_state(state.spec.directory) or state
    if name not in state.spec.node_names:
        raise UsageError(f"no node {name} in this cluster")
    role = f"slurmd:{name}"
    env = {
        "PATH": SYSTEM_PATH,
        "SLURM_CONF": str(state.spec.conf_path),
        "SP_TESTCLUSTER_DIR": str(state.spec.directory),
    }
    current = next((p for p in state.processes if p.role == role), None)
    if current is None or not current.alive:
        state.processes = [p for p in state.processes if p.role != role]
        state.processes.append(_start_slurmd(state, name, env))
        save_state(state)
    slurm = Slurm(env={**os.environ, **state.env()})

    def back() -> bool:
        node = next(iter(slurm.nodes([name])), None)
        if node is not None and node.available:
            return True
        try:  # with ReturnToService=2 a registering node may come back by itself; else resume it
            slurm.resume([name])
        except Exception:
            pass
        return False

    _await(back, timeout, f"node {name} did not come back", state)


def env_lines(state: ClusterState) -> list[str]:
    """``export`` lines for a shell; PATH keeps the shell's own after the release's commands."""
    env = state.env()
    quoted = {key: shlex.quote(value) for key, value in env.items()}
    if "PATH" in env:
        quoted["PATH"] = f'{shlex.quote(env["PATH"].split(":", 1)[0])}:"$PATH"'
    return [f"export {key}={value}" for key, value in quoted.items()]


def status(directory: Path) -> dict:
    """A summary of the cluster in ``directory`` for people and ``--json``."""
    state = load_state(directory)
    if state is None:
        return {"directory": str(directory), "running": False, "processes": [], "nodes": []}
    processes = [{"role": p.role, "pid": p.pid, "alive": p.alive} for p in state.processes]
    nodes: Sequence = []
    running = bool(state.processes) and all(p["alive"] for p in processes)
    if any(p["role"] == "slurmctld" and p["alive"] for p in processes):
        try:
            found = Slurm(env={**os.environ, **state.env()}, timeout=10).nodes()
            nodes = [
                {
                    "name": n.name,
                    "state": n.state,
                    "flags": sorted(n.flags),
                    "features": list(n.features),
                    "reason": n.reason,
                }
                for n in found
            ]
        except Exception:
            nodes = []
    return {
        "directory": str(directory),
        "running": running,
        "slurm": state.spec.slurm,
        "version": _version(state) if running else None,
        "conf": str(state.spec.conf_path),
        "ready_seconds": state.ready_seconds,
        "processes": processes,
        "nodes": nodes,
    }


def _version(state: ClusterState) -> str | None:
    """What the cluster's own ``sinfo --version`` says (``slurm-wlm 24.11.5``)."""
    try:
        return Slurm(env={**os.environ, **state.env()}, timeout=10).run(["sinfo", "--version"]).strip()
    except Exception:
        return None
