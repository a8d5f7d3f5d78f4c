"""An in-memory Slurm for fast unit tests of the watcher's decisions. Never for integration tests:
whatever is about Slurm itself is tested on the real local cluster.

``FakeSlurm`` answers the calls of ``slurm_preempt.slurm.interface.WatcherSlurm`` (mypy checks that it
does) the way Slurm does on the local cluster, where the cluster tests check each behaviour: a DOWN
after a DRAIN overwrites the reason and its time, and a requeued job waits PENDING with Reason=BeginTime
and Restarts + 1 (test_testcluster.py, test_drain_then_down_requeues_with_restart_count); an array's
own id names every task of the array, ``A_T`` one task (test_slurm_behaviour.py,
test_one_array_task_runs_with_the_arrays_own_id); scancel names on stderr each job it could not signal,
in Slurm's words for a gone job (test_commands.py, test_slurms_words_for_a_job_that_is_gone). It
records every call, fails or times out on demand, and takes its time from an injected ``Clock``:
nothing sleeps.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from slurm_preempt.errors import JobGoneError, SlurmTimeoutError
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.slurm.priority import Queued

T0 = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"}
GONE = "Invalid job id specified"


class Clock:
    """The present moment, moved on by the test. Call it to read it (the watcher's ``clock``)."""

    def __init__(self, start: datetime = T0):
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@dataclass
class FakeNode:
    name: str
    features: tuple[str, ...]
    drain: bool = False
    down: bool = False
    reason: str = ""
    reason_time: datetime | None = None


@dataclass
class FakeJob:
    job_id: str
    state: str
    nodes: tuple[str, ...] = ()
    comment: str = ""
    reason: str = "None"
    restart_count: int = 0
    features: str = ""
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None  # None: long ago, as far as the watcher cares
    array_job_id: str = ""
    array_task_id: str = ""
    user: str = "root"
    priority: int = 1000
    signals: list[str] = field(default_factory=list)

    @property
    def display_id(self) -> str:
        return f"{self.array_job_id}_{self.array_task_id}" if self.array_task_id else self.job_id

    def snapshot(self) -> Job:
        return Job(
            self.job_id,
            self.state,
            self.reason,
            nodes=self.nodes,
            restart_count=self.restart_count,
            features=self.features,
            comment=self.comment,
            submit_time=self.submit_time,
            eligible_time=self.eligible_time,
            start_time=self.start_time,
            array_job_id=self.array_job_id,
            array_task_id=self.array_task_id,
            user=self.user,
            partition="batch",
            num_nodes=len(self.nodes),
        )


@dataclass(frozen=True)
class Call:
    name: str  # nodes, jobs, queue, signal_many, requeue, update_job, release
    args: dict[str, Any]


class FakeSlurm:
    """Nodes pre1..pre4 (feature ``preemptible``) and std1..std2 (``standard``), no jobs."""

    def __init__(self, clock: Clock, preemptible: int = 4, standard: int = 2, keep_calls: int | None = None):
        """``keep_calls``: remember only the last N calls (a soak test of 100,000 polls)."""
        self.clock = clock
        names = [(f"pre{i}", "preemptible") for i in range(1, preemptible + 1)]
        names += [(f"std{i}", "standard") for i in range(1, standard + 1)]
        self.node_table = {name: FakeNode(name, (feature,)) for name, feature in names}
        self.job_table: dict[str, FakeJob] = {}
        self.calls: deque[Call] = deque(maxlen=keep_calls)
        self.refused: dict[str, str] = {}  # display id -> why scancel cannot signal it
        self.on_signal: Callable[[list[str]], None] = lambda _ids: None
        self._failures: dict[str, list[BaseException]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ test controls

    def add_job(self, job_id: str, nodes: Sequence[str] = (), comment: str = "", **fields: Any) -> FakeJob:
        state = fields.pop("state", "RUNNING" if nodes else "PENDING")
        job = FakeJob(job_id, state, tuple(nodes), comment, submit_time=self.clock(), **fields)
        self.job_table[job_id] = job
        return job

    def drain(self, names: Iterable[str], reason: str) -> None:
        for node in self._nodes_named(names):
            node.drain, node.reason, node.reason_time = True, reason, self.clock()

    def set_down(self, names: Iterable[str], reason: str = "Not responding") -> None:
        """Slurm overwrites the drain's reason and time with the DOWN's."""
        for node in self._nodes_named(names):
            node.down, node.reason, node.reason_time = True, reason, self.clock()

    def resume(self, names: Iterable[str]) -> None:
        for node in self._nodes_named(names):
            node.drain, node.down, node.reason, node.reason_time = False, False, "", None

    def start(self, job_id: str, nodes: Sequence[str]) -> None:
        job = self.job_table[job_id]
        job.state, job.nodes, job.reason = "RUNNING", tuple(nodes), "None"

    def end(self, job_id: str) -> None:
        """The job is gone from the controller (ended long enough ago)."""
        del self.job_table[job_id]

    def fail_next(self, call: str, error: BaseException | None = None, times: int = 1) -> None:
        """The next ``times`` calls of ``call`` raise ``error`` (default: a timeout)."""
        error = error or SlurmTimeoutError([call], 15)
        self._failures.setdefault(call, []).extend([error] * times)

    def called(self, name: str) -> list[dict[str, Any]]:
        return [c.args for c in self.calls if c.name == name]

    def queries(self) -> int:
        return sum(c.name in ("nodes", "jobs") for c in self.calls)

    def job(self, job_id: str) -> FakeJob:
        return self.job_table[job_id]

    # ------------------------------------------------------------------------------------ WatcherSlurm

    def nodes(
        self, *, names: Iterable[str] | None = None, states: str | None = None, partition: str | None = None
    ) -> list[Node]:
        chosen = tuple(names) if names is not None else None
        self._enter("nodes", names=chosen, states=states, partition=partition)  # one partition: "batch"
        wanted = set(states.lower().split(",")) if states else None  # drain, down and idle are modelled
        with self._lock:
            found = [self._as_node(node) for node in self.node_table.values()]
        return [
            node
            for node in found
            if (chosen is None or node.name in chosen)
            and (partition in (None, "batch"))
            and (
                wanted is None
                or ("drain" in wanted and node.drain)
                or ("down" in wanted and node.down)
                or ("idle" in wanted and node.state == "IDLE" and not node.drain)
            )
        ]

    def jobs(
        self,
        *,
        job_ids: Iterable[str] | None = None,
        nodes: Iterable[str] | None = None,
        states: str | None = None,
        user: str | None = None,
    ) -> list[Job]:
        ids = set(job_ids or ())
        on = set(nodes or ())
        self._enter("jobs", job_ids=tuple(sorted(ids)), nodes=tuple(sorted(on)), states=states, user=user)
        # squeue shows active jobs by default, and every state when given job ids.
        wanted = {s.upper() for s in states.split(",")} if states else (None if ids else ACTIVE)
        with self._lock:
            return [
                job.snapshot()
                for job in self.job_table.values()
                if (not ids or job.job_id in ids)
                and (not on or on & set(job.nodes))
                and (wanted is None or "ALL" in wanted or job.state in wanted)
                and (user is None or job.user == user)
            ]

    def queue(self, partition: str) -> list[Queued]:
        self._enter("queue", partition=partition)  # one partition: "batch"
        with self._lock:
            return [
                Queued(j.job_id, j.priority, j.state, j.reason)
                for j in self.job_table.values()
                if partition == "batch" and j.state in ("PENDING", "RUNNING")
            ]

    def signal_many(self, job_ids: Sequence[str], signal: str, *, batch_only: bool = False) -> str:
        self._enter("signal_many", job_ids=tuple(job_ids), signal=signal, batch_only=batch_only)
        self.on_signal(list(job_ids))
        errors = []
        with self._lock:
            for name in job_ids:
                if name in self.refused:
                    errors.append(f"scancel: error: Kill job error on job id {name}: {self.refused[name]}")
                    continue
                targets = [j for j in self._resolve(name) if j.state == "RUNNING"]
                if not targets:
                    errors.append(f"scancel: error: Kill job error on job id {name}: {GONE}")
                for job in targets:
                    job.signals.append(signal)
        return "\n".join(errors)

    def requeue(self, job_id: str) -> None:
        self._enter("requeue", job_id=job_id)
        with self._lock:
            targets = [j for j in self._resolve(job_id) if j.state == "RUNNING"]
            if not targets:
                raise JobGoneError(["scontrol", "requeue", job_id], 1, GONE)
            for job in targets:
                self._requeue(job)

    def update_job(self, job_id: str, **fields: str) -> None:
        self._enter("update_job", job_id=job_id, **fields)
        with self._lock:
            targets = self._resolve(job_id)
            if not targets:
                raise JobGoneError(["scontrol", "update", f"jobid={job_id}"], 1, GONE)
            for job in targets:
                if fields.get("starttime") == "now" and job.reason == "BeginTime":
                    job.reason = "Priority"
                if "features" in fields:
                    job.features = fields["features"]

    def release(self, job_id: str) -> None:
        """Slurm lifts the hold; a requeued job then waits for its BeginTime."""
        self._enter("release", job_id=job_id)
        with self._lock:
            targets = self._resolve(job_id)
            if not targets:
                raise JobGoneError(["scontrol", "release", job_id], 1, GONE)
            for job in targets:
                job.state, job.reason = "PENDING", "BeginTime"

    # ------------------------------------------------------------------------------------ inside

    def requeue_by_job(self, job_id: str) -> None:
        """What the job itself does on a notice (``scontrol requeue`` from its handler): not recorded
        as a watcher call."""
        with self._lock:
            self._requeue(self.job_table[job_id])

    def _requeue(self, job: FakeJob) -> None:
        job.state, job.reason, job.nodes = "PENDING", "BeginTime", ()
        job.restart_count += 1
        job.submit_time = self.clock().replace(microsecond=0)  # reset at a requeue, in whole seconds

    def _resolve(self, name: str) -> list[FakeJob]:
        """``A_T`` names one task; a bare id that is an array's own id names every task of it (22.05)."""
        if "_" in name:
            return [j for j in self.job_table.values() if j.display_id == name]
        tasks = [j for j in self.job_table.values() if j.array_task_id and j.array_job_id == name]
        if tasks:
            return tasks
        return [j for j in self.job_table.values() if j.job_id == name]

    def _enter(self, name: str, **args: Any) -> None:
        with self._lock:
            self.calls.append(Call(name, args))
            pending = self._failures.get(name)
            error = pending.pop(0) if pending else None
        if error is not None:
            raise error

    def _nodes_named(self, names: Iterable[str]) -> list[FakeNode]:
        return [self.node_table[n] for n in names]

    def _as_node(self, node: FakeNode) -> Node:
        busy = any(node.name in j.nodes and j.state == "RUNNING" for j in self.job_table.values())
        base = "DOWN" if node.down else "MIXED" if busy else "IDLE"
        flags = frozenset({"DRAIN"} if node.drain else set())
        return Node(node.name, base, flags, node.features, node.reason, node.reason_time, "root")


# mypy checks this file (pyproject.toml): a FakeSlurm that drifts from the protocol fails it here.
_CONFORMS: WatcherSlurm = FakeSlurm(Clock())
