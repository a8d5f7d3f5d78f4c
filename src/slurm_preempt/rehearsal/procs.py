"""Processes the local test cluster starts, finds and stops (psutil; never ``kill`` by name alone).

A started process is remembered by pid *and* the clock tick it started at (``procinfo``: not psutil's
wall-clock ``create_time()``, which a clock step moves), so a recycled pid is never mistaken for one of
ours. Zombies count as stopped: on machines whose PID 1 does not reap (containers,
sandboxes) a killed daemon lingers as a zombie that holds no port, no file and no CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from slurm_preempt import procinfo

# Daemons live in sbin, which a user's PATH (or sudo's) may lack.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def which(binary: str) -> str | None:
    """Where ``binary`` is, on PATH or in the system folders."""
    return shutil.which(binary, path=os.environ.get("PATH", "") + ":" + SYSTEM_PATH)


@dataclass(frozen=True)
class Started:
    """A process we started: enough to find it again, and only it."""

    role: str  # munged, slurmctld, slurmd:pre1, ...
    pid: int
    create_time: float  # wall clock, for people reading cluster.json; identity is start_ticks
    argv: tuple[str, ...]
    start_ticks: int | None = None  # None in a cluster.json written before it was recorded

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Started:
        ticks = data.get("start_ticks")
        return cls(
            data["role"],
            int(data["pid"]),
            float(data["create_time"]),
            tuple(data["argv"]),
            None if ticks is None else int(ticks),
        )

    def process(self) -> psutil.Process | None:
        """The live process, or None when it ended (or the pid now belongs to someone else)."""
        try:
            proc = psutil.Process(self.pid)
            if self.start_ticks is not None:
                if procinfo.start_ticks(self.pid) != self.start_ticks:
                    return None
            elif abs(proc.create_time() - self.create_time) > 1.5:  # a clock step moves it (procinfo)
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    @property
    def alive(self) -> bool:
        return self.process() is not None


def start(role: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> Started:
    """Start a daemon in the foreground of its own session, its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C or closed terminal must not take the cluster down
            close_fds=True,
        )
    created = psutil.Process(proc.pid).create_time()
    return Started(role, proc.pid, created, tuple(argv), procinfo.start_ticks(proc.pid))


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def stop(processes: Iterable[psutil.Process], grace: float = 10.0) -> list[int]:
    """SIGTERM, wait up to ``grace`` seconds, SIGKILL the rest. Returns the pids that needed a kill."""
    procs = [p for p in processes if p is not None]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=grace)
    alive = [p for p in alive if _running(p)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=2)
    return [p.pid for p in alive]


def kill_now(processes: Iterable[psutil.Process]) -> int:
    """SIGKILL at once (a machine that vanishes sends nothing). Returns how many were killed."""
    count = 0
    for proc in processes:
        try:
            proc.kill()
            count += 1
        except psutil.NoSuchProcess:
            pass
    return count


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def with_env(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment holds ``name=value`` (how we tag a cluster's daemons)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid == os.getpid() or not _running(proc):
                continue
            if proc.environ().get(name) == value:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def mount_namespace(proc: psutil.Process | None = None) -> str | None:
    """The mount namespace of ``proc`` (this process when None), e.g. ``mnt:[4026531841]``."""
    try:
        return os.readlink(f"/proc/{proc.pid if proc else 'self'}/ns/mnt")
    except OSError:
        return None


@contextmanager
def pinned_mount_namespaces(procs: Iterable[psutil.Process]) -> Iterator[set[str]]:
    """The mount namespaces of ``procs`` other than ours, held open until the block ends.

    A namespace's id is an inode number the kernel hands out again once the namespace dies: after its
    last process is killed, a daemon of another cluster started that moment may get the same id, and a
    kill "of everything in that namespace" would hit it. An open descriptor keeps the namespace (and so
    its id) alive."""
    ours, held, names = mount_namespace(), [], set()
    try:
        for proc in procs:
            try:
                fd = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            held.append(fd)
            name = os.readlink(f"/proc/self/fd/{fd}")
            if name != ours:
                names.add(name)
        yield names
    finally:
        for fd in held:
            os.close(fd)


def in_mount_namespaces(namespaces: set[str]) -> list[psutil.Process]:
    """Live processes in any of ``namespaces`` (a node of another Slurm release runs in its own)."""
    if not namespaces:
        return []
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid != os.getpid() and _running(proc) and mount_namespace(proc) in namespaces:
            found.append(proc)
    return found


def listening_under(name: str, folder: Path) -> list[psutil.Process]:
    """Processes called ``name`` with a unix socket under ``folder``.

    This is how a node's slurmstepd processes are found: each listens on
    ``<SlurmdSpoolDir>/<node>_<job>.<step>``, and the spool folder is per node. (Their environment
    cannot tell: slurmstepd overwrites it with its process title.)
    """
    prefix = str(folder).rstrip("/") + "/"
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] != name or not _running(proc):
                continue
            if any(str(c.laddr).startswith(prefix) for c in proc.net_connections(kind="unix")):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def tree(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The processes and all their descendants (collected before anything is killed)."""
    out: dict[int, psutil.Process] = {}
    for proc in procs:
        out[proc.pid] = proc
        try:
            for child in proc.children(recursive=True):
                out[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    return list(out.values())


def environ_of(proc: psutil.Process) -> dict[str, str]:
    """The environment of a process; empty when it is gone or not ours to read."""
    try:
        return proc.environ()
    except psutil.Error:
        return {}
