"""Run inside a source-built Slurm root (``RootRuntime.chroot_argv``), with pyslurm on PYTHONPATH and the
cluster's SLURM_CONF: the watcher's poll reads and one poll's decisions through each backend, as one
JSON object on stdout (tests/test_pyslurm_cluster.py, bench/bench_pyslurm.py).

    python tests/pyslurm_poll.py compare      records and decisions of the CLI and of pyslurm
    python tests/pyslurm_poll.py bench N      N rounds of the poll's reads, backends alternated

A decision is a write the watcher asks for (a signal, a requeue, an update): recorded, never sent,
so both backends decide on the same cluster state.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slurm_preempt.slurm import pyslurm_backend
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.watch import launchhold
from slurm_preempt.watch.sentstate import SentState
from slurm_preempt.watch.settings import settings_from
from slurm_preempt.watch.watcher import NODE_STATES, RUNNING_STATES, Watcher


class Recording:
    """The writes of the watcher's Slurm, recorded instead of run."""

    def __init__(self, reads: Slurm) -> None:
        self.reads = reads
        self.calls: list[list[Any]] = []

    def nodes(self, **query: Any) -> Any:
        return self.reads.nodes(**query)

    def jobs(self, **query: Any) -> Any:
        return self.reads.jobs(**query)

    def signal_many(self, job_ids: Any, signal: str, *, batch_only: bool = False) -> str:
        self.calls.append(["signal", sorted(job_ids), signal, batch_only])
        return ""

    def requeue(self, job_id: str) -> None:
        self.calls.append(["requeue", job_id])

    def update_job(self, job_id: str, **fields: str) -> None:
        self.calls.append(["update", job_id, sorted(fields.items())])

    def release(self, job_id: str) -> None:
        self.calls.append(["release", job_id])


def backends() -> dict[str, Slurm]:
    cli = Slurm(timeout=30, cwd="/")
    chosen = pyslurm_backend.choose("pyslurm", cli)
    if not isinstance(chosen, pyslurm_backend.PyslurmSlurm):
        raise SystemExit("pyslurm backend not usable here (see the log above)")
    return {"cli": cli, "pyslurm": chosen}


def reads(slurm: Slurm) -> dict[str, Any]:
    """What a cluster poll reads, in the watcher's words."""
    nodes = slurm.nodes(states=NODE_STATES)
    names = [n.name for n in nodes]
    running = slurm.jobs(nodes=names, states=RUNNING_STATES) if names else []
    pending = slurm.jobs(states=launchhold.PENDING_STATES)
    every = slurm.nodes()
    return {"nodes": every, "drained": nodes, "running": running, "pending": pending}


def decisions(slurm: Slurm, state_dir: Path) -> dict[str, Any]:
    recording = Recording(slurm)
    watcher = Watcher(recording, settings_from({}), SentState(), state_dir)  # type: ignore[arg-type]
    result = watcher.poll_once().to_json()
    return {"calls": sorted(recording.calls, key=json.dumps), "actions": result["actions"],
            "draining": result["draining"], "new_events": result["new_events"]}  # fmt: skip


def as_json(value: Any) -> Any:
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in asdict(value).items()}
    return value


def compare() -> dict[str, Any]:
    found = {}
    for name, slurm in backends().items():
        with tempfile.TemporaryDirectory(prefix=f"sp-pyslurm-{name}-") as folder:
            found[name] = {"reads": as_json(reads(slurm)), "decisions": decisions(slurm, Path(folder))}
    return found


def bench(rounds: int) -> dict[str, Any]:
    """Seconds per poll (the watcher's three reads), backends alternated, medians."""
    chosen = backends()
    times: dict[str, list[float]] = {name: [] for name in chosen}
    for _ in range(rounds):
        for name, slurm in chosen.items():
            began = time.perf_counter()
            names = [n.name for n in slurm.nodes(states=NODE_STATES)]
            if names:
                slurm.jobs(nodes=names, states=RUNNING_STATES)
            slurm.jobs(states=launchhold.PENDING_STATES)
            times[name].append(time.perf_counter() - began)
    return {name: {"median_s": statistics.median(t), "quartiles_s": statistics.quantiles(t, n=4)[::2],
                   "rounds": len(t)} for name, t in times.items()}  # fmt: skip


if __name__ == "__main__":
    mode = sys.argv[1]
    answer = compare() if mode == "compare" else bench(int(sys.argv[2]))
    print(json.dumps(answer, default=str))
