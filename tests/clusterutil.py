"""Helpers for integration tests on the real local cluster (polling, never fixed sleeps)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from slurm_preempt.errors import SlurmError
from slurm_preempt.notice import utcnow
from slurm_preempt.rehearsal import procs, versions
from slurm_preempt.rehearsal import testcluster as tc
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch import actions


def release() -> str:
    """The Slurm release this session's clusters run (``--slurm`` / SP_TEST_SLURM; conftest sets it)."""
    return os.environ.get("SP_TEST_SLURM", versions.SYSTEM)


def base_port() -> int:
    """The session cluster's port (SP_TEST_PORT); a release's session runs 100 above the last."""
    return int(os.environ.get("SP_TEST_PORT", "17300"))


# Clusters a test module starts for itself (settings the session cluster must not have), each on its
# own port above the session cluster's and in a folder beside it: one table, so that no two collide.
OWN_CLUSTERS = {"launch": 30, "tuned": 40, "hooks": 50, "deadline": 60, "adaptive": 70, "simulate": 80}


def cluster_dir(port: int, suffix: str = "") -> Path:
    """Where a test cluster lives: SP_TEST_CLUSTER_DIR, else one folder per port and release (each
    release's slurmdbd upgrades the accounting database it finds, which an older one cannot read)."""
    base = os.environ.get("SP_TEST_CLUSTER_DIR", f"/tmp/sp-test-cluster-{port}")
    if release() != versions.SYSTEM:
        base += f"-{release()}"
    return Path(base + suffix)


def slurm_problem() -> str | None:
    """Why no test cluster can start here (None when one can). Building a release's root happens here,
    once, before any cluster starts."""
    if os.geteuid() != 0:
        return "the local test cluster needs root"
    try:
        tc.check_packages(release())
    except Exception as exc:  # MissingDependencyError, or a root that could not be built
        return str(exc)
    return None


# The least time any wait of the cluster tests gives its condition. A wait's timeout only ends a hung
# test: the numbers at the call sites say how long the thing takes on an idle machine, and a shared CI
# host under load can take several times that (issue 29), so no wait gives up sooner than this.
HUNG_AFTER = 180.0


def wait_for(
    predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition", log: Path | None = None
):
    """Poll until ``predicate()`` returns something truthy; return it, or fail once ``timeout`` (at
    least HUNG_AFTER) seconds have passed, quoting the end of ``log`` (a job's output) if given."""
    timeout = max(timeout, HUNG_AFTER)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = ""
            if log is not None:
                tail = "\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else f"({log} absent)")
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{tail}")
        time.sleep(interval)


def wait_signal_age(slurm: Slurm, job_id: str) -> Job:
    """Wait until the job started ``signal_after_start`` ago (by the clock the watcher reads): a watcher
    holds a younger job's signal back to a later poll, since its script may not trap it yet. For tests
    that expect the signal at the first poll after a drain."""
    from slurm_preempt.notice import utcnow
    from slurm_preempt.watch.settings import DEFAULTS

    def old_enough() -> Job | None:
        job = slurm.job(job_id)
        if job is None or job.start_time is None:
            return None
        return job if (utcnow() - job.start_time).total_seconds() >= DEFAULTS["signal_after_start"] else None

    return wait_for(old_enough, 30, what=f"job {job_id} {DEFAULTS['signal_after_start']:g} s past its start")


def requeue_second_over(job: Job) -> bool:
    """The second Slurm requeued the job in (its SubmitTime) is over, as the watcher waits for: a
    launch within it on a node the job left is killed ("Job credential revoked", FAILED)."""
    return actions.requeue_second_over(job, utcnow())


def lift_requeue_hold(slurm: Slurm, job_id: str) -> bool:
    """What the watcher's fast restart does (``scontrol update starttime=now``), with its rule: True
    once Slurm took it; False while the job is not pending, still in its requeue's second, or still
    COMPLETING (Slurm refuses the update then). Poll it with ``wait_for``."""
    job = slurm.job(job_id)
    if job is None or job.state != "PENDING" or not requeue_second_over(job):
        return False
    try:
        slurm.update_job(job_id, starttime="now")
    except SlurmError:
        return False
    return True


@contextmanager
def exported(env: dict[str, str]) -> Iterator[None]:
    """Put a cluster's variables (SLURM_CONF, ...) in os.environ for a while, then restore them."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class ClusterHandle:
    state: tc.ClusterState
    workdir: Path
    slurm: Slurm = field(default_factory=lambda: Slurm(timeout=20))

    @property
    def spec(self) -> tc.ClusterSpec:
        return self.state.spec

    def job(self, job_id: str) -> Job | None:
        return self.slurm.job(job_id)

    def wait_state(self, job_id: str, states, timeout: float = 30.0) -> Job:
        wanted = {states} if isinstance(states, str) else set(states)

        def check():
            job = self.job(job_id)
            return job if job is not None and job.state in wanted else None

        return wait_for(check, timeout, what=f"job {job_id} in {sorted(wanted)}")

    def remove_node(self, name: str, reason: str = "removed") -> int:
        return tc.remove_node(self.state, name, reason)

    def revive_node(self, name: str) -> None:
        tc.revive_node(self.state, name)

    def fresh(self) -> tc.ClusterState:
        """The cluster as cluster.json says now (drills and tests restart slurmds)."""
        return tc.load_state(self.state.spec.directory) or self.state

    def everywhere(self, script: str) -> None:
        """``sh -c script`` on the host and in each daemon's own mount namespace. Another release's
        daemons run in private ones (slurmroot): a mount made on the host after they started is not
        theirs, so a test that breaks a file system must break it where the hooks run too."""
        subprocess.run(["sh", "-c", script], check=True)
        ours = procs.mount_namespace()
        seen = set()
        for started in self.fresh().processes:
            proc = started.process()
            namespace = procs.mount_namespace(proc) if proc else None
            if proc is None or namespace in (None, ours) or namespace in seen:
                continue
            seen.add(namespace)
            subprocess.run(["nsenter", "-t", str(proc.pid), "-m", "-r", "--", "sh", "-c", script], check=True)

    def reset(self) -> None:
        """Cancel every job and bring every node back.

        A job stays COMPLETING until each of its nodes has ended it, so a node still down keeps it there:
        while waiting, nodes are brought back and what is left is cancelled again (a requeue that raced
        the first scancel puts a job back to PENDING)."""
        self.slurm.cancel_many([j.job_id for j in self.slurm.jobs()])
        last_try = [time.monotonic()]

        def ended() -> bool:
            left = self.slurm.jobs(states="running,completing,pending")
            if left and time.monotonic() - last_try[0] > 15:
                last_try[0] = time.monotonic()
                self._revive_nodes()
                self.slurm.cancel_many([j.job_id for j in left])
            return not left

        try:
            wait_for(ended, 90, what="jobs to end")
        except AssertionError as error:
            left = [(j.job_id, j.state, j.reason, j.nodes) for j in self.slurm.jobs()]
            nodes = [(n.name, n.state) for n in self.slurm.nodes()]
            raise AssertionError(f"{error}: jobs {left}, nodes {nodes}") from None
        self._revive_nodes()

    def _revive_nodes(self) -> None:
        for node in self.slurm.nodes():
            if not node.available:
                tc.revive_node(self.state, node.name)


SP = str(Path(sys.executable).parent / "slurm-preempt")
SRC = Path(__file__).resolve().parents[1] / "src"


def python_for_user(user: str) -> tuple[str, str]:
    """An interpreter `user` may run, and the PYTHONPATH that finds slurm-preempt and its packages
    (this venv's interpreter may live under /root, which other users cannot enter)."""
    paths = [str(SRC), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = [runuser, "-u", user, "--", candidate, "-c", "import click"]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(paths)}
        if subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0:
            return candidate, os.pathsep.join(paths)
    raise AssertionError(f"no Python that {user} may run finds slurm-preempt's packages")


@contextmanager
def running_cluster(spec: tc.ClusterSpec, workdir: Path) -> Iterator[ClusterHandle]:
    """A fixture's own cluster: a folder left by an interrupted session is cleared or restarted fresh,
    the cluster's environment is exported while in use, and everything is stopped afterwards."""
    if spec.directory.exists() and tc.load_state(spec.directory) is None:
        shutil.rmtree(spec.directory)
    tc.down(spec.directory)
    state = tc.up(spec, timeout=120)
    try:
        with exported(state.env()):
            yield ClusterHandle(state=state, workdir=workdir)
    finally:
        tc.down(spec.directory)


@contextmanager
def own_cluster(name: str, workdir: Path | None = None, **fields) -> Iterator[ClusterHandle]:
    """A module's own cluster ``name`` (``OWN_CLUSTERS``), with ``fields`` of its ``ClusterSpec``. Jobs
    work in ``workdir``, else in a fresh world-writable folder beside the cluster's (jobs of other users
    must read their scripts and write their output: not under pytest's 0700 temporary folders)."""
    import pytest

    problem = slurm_problem()
    if problem:
        pytest.skip(problem)  # a failure under CI=true (conftest), like every skip
    directory = cluster_dir(base_port(), f"-{name}")
    spec = tc.ClusterSpec(
        directory=directory, port=base_port() + OWN_CLUSTERS[name], slurm=release(), **fields
    )
    if workdir is None:
        workdir = directory.with_name(directory.name + "-jobs")
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir()
        os.chmod(workdir, 0o1777)
    with running_cluster(spec, workdir) as handle:
        yield handle


def submit_generated(cl: ClusterHandle, work: Path, options: list[str], command: list[str]) -> str:
    """Generate a script with `slurm-preempt sbatch` in ``work`` (created) and submit it."""
    work.mkdir()
    script = work / "job.sbatch"
    subprocess.run(
        [SP, "sbatch", "--chdir", str(work), "--checkpoint-dir", str(work / "ckpt"), *options,
         "--write", str(script), "--", *command],
        check=True, capture_output=True,
    )  # fmt: skip
    return cl.slurm.submit(str(script))


@contextmanager
def running_watcher(
    cl: ClusterHandle,
    log_path: Path,
    grace: float,
    extra: Sequence[str] = (),
    program: Sequence[str] = (SP,),
    env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen]:
    """The cluster watcher daemon, polling every second, for the length of a test (``extra``: more
    options; ``program`` and ``env``: how to start slurm-preempt, e.g. inside another release's root)."""
    log = open(log_path, "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*program, "watch", "--cluster", "--interval", "1", "--grace", str(grace), "--allow-preemptible-host",
         "--state-dir", str(cl.spec.state_dir), *extra],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
