"""A real multi-node Slurm cluster on this one host, from Debian's packages, for demos and tests.

One munged, one slurmctld and one ``slurmd -N NAME`` per node, all as root, every file (config, munge
key and socket, state, spool, logs) under one folder, on ports of its own so it never meets a real
Slurm. Nodes carry the features ``standard`` or ``preemptible`` and may declare more CPUs than the
host has (``SlurmdParameters=config_overrides``), so many small jobs fit. Its shape, slurm.conf and
``cluster.json`` are in ``clusterspec.py``; this module starts, stops, removes and revives. By default it
runs the host's Slurm; ``slurm="24.11"`` or ``"26.05"`` runs that release from a Debian root built once in
a cache folder (``versions``, ``slurmroot``).

Each daemon is started in the foreground of its own session and remembered by pid and creation time
in ``cluster.json``; ``down`` stops exactly those. Each slurmd is started with
``SP_TESTCLUSTER_NODE=<name>`` in its environment, which its slurmstepd processes inherit: that is how
``remove_node`` finds a node's job processes to kill them as a vanishing machine would. Progress is
logged (``testcluster: starting munged``).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_preempt.admin import hooks
from slurm_preempt.durable import write_atomic
from slurm_preempt.errors import ClusterError, SlurmError, UsageError
from slurm_preempt.rehearsal import accounting, procs, versions
from slurm_preempt.rehearsal.clusterspec import (
    DEFAULT_DIR,
    DEFAULT_PORT,
    ClusterSpec,
    ClusterState,
    env_lines,
    load_state,
    render_conf,
    save_state,
)
from slurm_preempt.rehearsal.procs import SYSTEM_PATH, Started
from slurm_preempt.slurm.commands import Slurm

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_PORT",
    "SYSTEM_PATH",
    "ClusterSpec",
    "ClusterState",
    "check_packages",
    "down",
    "env_lines",
    "load_state",
    "remove_node",
    "revive_node",
    "status",
    "up",
]

log = logging.getLogger(__name__)


def check_packages(slurm: str = versions.SYSTEM) -> None:
    """Raise MissingDependencyError naming what to install (for another release: build its root)."""
    versions.runtime(slurm).check()


def _daemon_env(spec: ClusterSpec) -> dict[str, str]:
    """What every daemon starts with; the folder tag lets ``down`` find daemons cluster.json lost."""
    return {
        "PATH": procs.SYSTEM_PATH,
        "SLURM_CONF": str(spec.conf_path),
        "SP_TESTCLUSTER_DIR": str(spec.directory),
    }


# ---------------------------------------------------------------------------------------- up / down


def up(spec: ClusterSpec, timeout: float = 90.0) -> ClusterState:
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
            log.info("already up in %s", spec.directory)
            return existing
        if existing.alive():
            log.warning("found a half-running cluster from an earlier run: stopping it")
            _stop_all(existing)
    elif spec.directory.is_dir() and any(spec.directory.iterdir()):
        raise ClusterError(f"{spec.directory} is not empty and holds no test cluster: choose another --dir")
    return _start(spec, timeout)


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
        write_atomic(key, os.urandom(1024), 0o400)


def _check_ports(spec: ClusterSpec) -> None:
    """Fail early, in one line, when another cluster (or anything else) holds our ports."""
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


def _start(spec: ClusterSpec, timeout: float) -> ClusterState:
    runtime = versions.runtime(spec.slurm)
    runtime.check()  # builds the release's root the first time
    began = time.monotonic()
    _check_ports(spec)
    _prepare_dirs(spec)
    d = spec.directory
    runtime.prepare_clients(d)
    # Clusters started side by side (one per release) must not hand out the same job ids: files keyed
    # by job id in shared folders (/tmp) would be one job's in one cluster and another's in the next.
    # Each port gets its own band of ids below Slurm's default MaxJobId (67,043,328); the band's width is
    # no multiple of 10,000, so neighbours' ids differ in their last digits too (Lightning's DDP port).
    first_job_id = 1000 + (spec.port % 1000) * 60_007 + int(time.time() // 2) % 60_000
    write_atomic(spec.conf_path, render_conf(spec, first_job_id, runtime.conf_lines()))
    if spec.hooks:  # the same code path as `slurm-preempt hooks install`
        hooks.install(d / "etc", spec.state_dir)
    state = ClusterState(spec=spec, started_at=time.time())
    env = _daemon_env(spec)
    try:
        log.info("starting munged")
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
            state.processes += accounting.start(spec, env)
            save_state(state)
        log.info("starting slurmctld")
        slurmctld = runtime.daemon_argv("slurmctld", ["-D"], [d])
        state.processes.append(procs.start("slurmctld", slurmctld, env, d / "log" / "slurmctld.out"))
        save_state(state)
        slurm = state.slurm()
        _await(slurm.ping, 30, "slurmctld did not answer", state)
        log.info("starting %d slurmd: %s", len(spec.node_names), ", ".join(spec.node_names))
        for name in spec.node_names:
            state.processes.append(_start_slurmd(state, name, env))
        save_state(state)
        _await(lambda: _all_idle(slurm, spec), timeout, "nodes did not all become idle", state)
    except BaseException:
        _stop_all(state)
        raise
    state.ready_seconds = round(time.monotonic() - began, 2)
    save_state(state)
    log.info("%d nodes idle after %.1f s", len(spec.node_names), state.ready_seconds)
    return state


def _start_slurmd(state: ClusterState, name: str, env: dict[str, str]) -> Started:
    d = state.spec.directory
    return procs.start(
        f"slurmd:{name}",
        versions.runtime(state.spec.slurm).daemon_argv("slurmd", ["-D", "-N", name], [d]),
        {**env, "SP_TESTCLUSTER_NODE": name},
        d / "log" / f"slurmd-{name}.out",
    )


def _await(predicate: Callable[[], Any], timeout: float, what: str, state: ClusterState) -> None:
    if procs.wait_until(predicate, timeout, 0.2):
        return
    dead = [p.role for p in state.processes if not p.alive]
    hint = f" ({', '.join(dead)} exited)" if dead else ""
    raise ClusterError(f"{what} within {timeout:g} s{hint}; see {state.spec.directory}/log/")


def _all_idle(slurm: Slurm, spec: ClusterSpec) -> bool:
    try:
        nodes = slurm.nodes()
    except SlurmError:
        log.debug("sinfo failed while waiting for the nodes", exc_info=True)
        return False
    idle = {n.name for n in nodes if n.state == "IDLE" and n.available}
    return idle >= set(spec.node_names)


def down(directory: Path = DEFAULT_DIR) -> int:
    """Stop what ``up`` started in ``directory`` and every job process left on its nodes.

    Returns how many processes were stopped (0 when nothing ran).
    """
    state = load_state(directory)
    if state is None:
        log.info("no test cluster in %s", directory)
        return 0
    if state.alive():
        _cancel_jobs(state)
    count = _stop_all(state)
    state.processes = []
    save_state(state)
    log.info("stopped %d processes", count)
    return count


def _cancel_jobs(state: ClusterState) -> None:
    slurm = state.slurm()
    try:
        ids = [j.job_id for j in slurm.jobs()]
        if ids:
            slurm.cancel_many(ids)
            procs.wait_until(lambda: not slurm.jobs(states="running,completing"), 10, 0.3)
    except SlurmError:  # a dead controller must not stop us from stopping the rest
        log.debug("cannot cancel the jobs left on the cluster", exc_info=True)


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
        if procs.environ_of(p).get("SP_TESTCLUSTER_DIR") == str(state.spec.directory)
    ]
    with procs.pinned_mount_namespaces(slurmd) as namespaces:
        killed = procs.kill_now(slurmd)
        # A job that just started may have a slurmstepd forked but not yet listening: look twice. On
        # another release each node runs in a mount namespace of its own, which holds exactly its
        # processes (pinned: its id is never another cluster's meanwhile).
        for _ in range(2):
            steps = procs.tree(procs.listening_under("slurmstepd", state.spec.directory / "spool" / name))
            killed += procs.kill_now(steps) + procs.kill_now(procs.in_mount_namespaces(namespaces))
            time.sleep(0.2)
    state.slurm(timeout=30).set_down([name], reason)
    return killed


def revive_node(state: ClusterState, name: str, timeout: float = 60.0) -> None:
    """Bring a removed node back: start its slurmd again and resume it."""
    # Re-read cluster.json: another holder of a ClusterState (the drill, a test) may have restarted
    # slurmds since this copy was loaded, and a stale copy would start a second slurmd for the node.
    state = load_state(state.spec.directory) or state
    if name not in state.spec.node_names:
        raise UsageError(f"no node {name} in this cluster")
    starts = [0]

    def ensure_slurmd() -> None:
        role = f"slurmd:{name}"
        current = next((p for p in state.processes if p.role == role), None)
        if current is not None and current.alive:
            return
        if starts[0]:  # it died on start: say why (its output's end), then start it again, as systemd would
            out = state.spec.directory / "log" / f"slurmd-{name}.out"
            tail = out.read_text(errors="replace").splitlines()[-3:] if out.exists() else []
            log.warning("slurmd %s exited on start (%s); starting it again", name, " | ".join(tail))
        starts[0] += 1
        state.processes = [p for p in state.processes if p.role != role]
        state.processes.append(_start_slurmd(state, name, _daemon_env(state.spec)))
        save_state(state)

    ensure_slurmd()
    slurm = state.slurm(timeout=30)

    def back() -> bool:
        if starts[0] < 4:
            ensure_slurmd()
        node = next(iter(slurm.nodes([name])), None)
        if node is not None and node.available:
            return True
        try:  # a registering node may come back by itself (not when it was set DOWN); else resume it
            slurm.resume([name])
        except SlurmError:
            log.debug("scontrol resume %s failed; trying again", name, exc_info=True)
        return False

    _await(back, timeout, f"node {name} did not come back", state)


def status(directory: Path) -> dict:
    """A summary of the cluster in ``directory`` for people and ``--json``."""
    state = load_state(directory)
    if state is None:
        return {"directory": str(directory), "running": False, "processes": [], "nodes": []}
    processes = [{"role": p.role, "pid": p.pid, "alive": p.alive} for p in state.processes]
    nodes: list[dict] = []
    running = bool(state.processes) and all(p["alive"] for p in processes)
    if any(p["role"] == "slurmctld" and p["alive"] for p in processes):
        try:
            found = state.slurm().nodes()
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
        except SlurmError:
            log.debug("sinfo failed", exc_info=True)
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
        return state.slurm().run(["sinfo", "--version"]).strip()
    except SlurmError:
        log.debug("sinfo --version failed", exc_info=True)
        return None
