"""Preemption drill: rehearse what a provider does to a preemptible node, and watch the jobs live through it.

One drill event on a set of nodes follows the provider's timeline:

    T+0       drain the nodes with a preemption-like reason (Slurm tells the jobs nothing)
    T+grace   remove them: on the local test cluster the node's slurmd and job processes are SIGKILLed
              first, then the node is set DOWN (an honest vanishing machine); on a real cluster the node
              is set DOWN (slurmd then gives the job SIGTERM and KillWait, which a real removal does not)
    +pause    bring them back (start slurmd again where we killed it, then resume)

Meanwhile every job that ran on the nodes at T+0 is observed with one ``squeue`` per tick: when it left
its node, when it was requeued, when and where it ran again; the ledger adds when it was told and when it
took its last checkpoint. Random mode draws events from a Poisson process (mean time between
preemptions), optionally taking several nodes at once (correlated preemption). What happens is logged as
it happens (``drill: T+0      drained pre1 (1234)``).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from slurm_preempt import ledger
from slurm_preempt.errors import ClusterError, SlurmError, UsageError
from slurm_preempt.notice import from_text, to_text
from slurm_preempt.rehearsal import testcluster as tc
from slurm_preempt.slurm.commands import Slurm

log = logging.getLogger(__name__)

DEFAULT_REASON = "TogetherPreemptionNotified: slurm-preempt drill"


def _utc(seconds: float | None) -> str | None:
    return to_text(datetime.fromtimestamp(seconds, timezone.utc)) if seconds else None


@dataclass
class JobWatch:
    """What one job did during one drill event (times are epoch seconds)."""

    job_id: str
    nodes: tuple[str, ...]
    restarts_before: int
    notified_at: float | None = None
    final_checkpoint_at: float | None = None
    final_checkpoint_step: int | None = None
    left_at: float | None = None
    requeued_at: float | None = None
    running_again_at: float | None = None
    where: tuple[str, ...] = ()
    ended: str = ""  # COMPLETED, FAILED, ... when it finished instead of coming back

    def verdict(self, removed_at: float | None) -> str:
        if self.ended == "COMPLETED" and self.running_again_at is None:
            return "finished inside the window"
        if self.left_at is None:
            return "still on the node"
        if self.running_again_at is None:
            return f"did not run again ({self.ended or 'pending'})"
        before_removal = removed_at is None or self.left_at < removed_at
        saved = self.final_checkpoint_at is not None and self.final_checkpoint_at <= self.left_at + 0.5
        back = self.running_again_at - self.left_at
        if saved and before_removal:
            return f"saved: final checkpoint, left before removal, running again after {back:.1f} s"
        if before_removal:
            return f"left before removal without a final checkpoint; running again after {back:.1f} s"
        return f"killed by the removal: work since the last checkpoint lost; back after {back:.1f} s"

    def to_json(self, removed_at: float | None) -> dict:
        return {
            "job_id": self.job_id,
            "nodes": list(self.nodes),
            "notified_at": _utc(self.notified_at),
            "final_checkpoint_at": _utc(self.final_checkpoint_at),
            "final_checkpoint_step": self.final_checkpoint_step,
            "left_at": _utc(self.left_at),
            "requeued_at": _utc(self.requeued_at),
            "running_again_at": _utc(self.running_again_at),
            "where": list(self.where),
            "ended": self.ended,
            "verdict": self.verdict(removed_at),
        }


@dataclass
class DrillEvent:
    nodes: tuple[str, ...]
    drain_at: float
    grace: float
    pause: float
    reason: str = DEFAULT_REASON
    removed_at: float | None = None
    revived_at: float | None = None
    jobs: dict[str, JobWatch] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.revived_at is not None and all(
            w.running_again_at is not None or w.ended for w in self.jobs.values()
        )

    def to_json(self) -> dict:
        return {
            "nodes": list(self.nodes),
            "reason": self.reason,
            "drained_at": _utc(self.drain_at),
            "removed_at": _utc(self.removed_at),
            "back_at": _utc(self.revived_at),
            "jobs": [w.to_json(self.removed_at) for w in self.jobs.values()],
        }


PHASES = ("notice", "checkpoint", "leave", "wait", "start")


def told_phases(event: DrillEvent, watch: JobWatch, resumed: list[float]) -> dict[str, float] | None:
    """The phases of a job told of ``event`` (drain -> notice -> final checkpoint -> left -> running again
    -> the program's first ``resumed_from`` at or after it, among ``resumed``), None when it lacks one."""
    if not (watch.notified_at and watch.final_checkpoint_at and watch.left_at and watch.running_again_at):
        return None
    restored = min((t for t in resumed if t >= watch.running_again_at), default=watch.running_again_at)
    return {
        "notice": watch.notified_at - event.drain_at,
        "checkpoint": watch.final_checkpoint_at - watch.notified_at,
        "leave": watch.left_at - watch.final_checkpoint_at,
        "wait": watch.running_again_at - watch.left_at,
        "start": max(0.0, restored - watch.running_again_at),
    }


@dataclass
class NodeOps:
    """How nodes are removed and brought back: the local cluster's honest kill, or plain DOWN/RESUME."""

    remove: Callable[[list[str], str], None]
    revive: Callable[[list[str]], None]
    local: bool


def node_ops(slurm: Slurm, allow_real: bool) -> NodeOps:
    """Pick the node operations for the cluster ``SLURM_CONF`` points at."""
    state = local_cluster(slurm)
    if state is not None:
        local = state

        def remove(names: list[str], reason: str) -> None:
            for name in names:
                tc.remove_node(local, name, reason)

        def revive(names: list[str]) -> None:
            for name in names:
                tc.revive_node(local, name)

        return NodeOps(remove=remove, revive=revive, local=True)
    if not allow_real:
        raise UsageError(
            "this is not slurm-preempt's local test cluster: a drill would drain and down real nodes; "
            "pass --real-cluster if you mean it"
        )
    return NodeOps(remove=slurm.set_down, revive=slurm.resume, local=False)


def local_cluster(slurm: Slurm) -> tc.ClusterState | None:
    """The local test cluster that ``SLURM_CONF`` points at, or None for any other cluster."""
    conf = (slurm.env or os.environ).get("SLURM_CONF")
    if not conf:
        return None
    directory = Path(conf).resolve().parent.parent  # <dir>/etc/slurm.conf
    try:
        state = tc.load_state(directory)
    except ClusterError:  # a cluster.json that is not ours to read: not the local test cluster
        log.debug("%s holds no readable test cluster", directory, exc_info=True)
        return None
    if state is None or state.spec.conf_path.resolve() != Path(conf).resolve():
        return None
    return state


class Drill:
    """Runs drill events and observes their jobs. Time and sleep are injectable for tests."""

    def __init__(
        self,
        slurm: Slurm,
        ops: NodeOps,
        state_dir: Path | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        tick: float = 0.5,
    ):
        self.slurm, self.ops, self.state_dir = slurm, ops, state_dir
        self.clock, self.sleep, self.tick = clock, sleep, tick
        self.events: list[DrillEvent] = []

    # ---------------------------------------------------------------------------------- phases

    def start_event(self, nodes: Iterable[str], grace: float, pause: float, reason: str) -> DrillEvent:
        names = tuple(nodes)
        running = [j for j in self.slurm.jobs(nodes=names, states="running")]
        self.slurm.drain(names, reason)
        event = DrillEvent(nodes=names, drain_at=self.clock(), grace=grace, pause=pause, reason=reason)
        event.jobs = {j.job_id: JobWatch(j.job_id, j.nodes, j.restart_count) for j in running}
        self.events.append(event)
        jobs = ", ".join(event.jobs) or "no jobs"
        log.info("T+0      drained %s (%s)", ",".join(names), jobs)
        return event

    def _advance(self, event: DrillEvent, now: float) -> None:
        if event.removed_at is None and now >= event.drain_at + event.grace:
            self.ops.remove(list(event.nodes), "removed by slurm-preempt drill")
            event.removed_at = self.clock()
            log.info("T+%-6.1f removed %s", event.removed_at - event.drain_at, ",".join(event.nodes))
        elif (
            event.removed_at is not None
            and event.revived_at is None
            and now >= event.removed_at + event.pause
        ):
            self.ops.revive(list(event.nodes))
            event.revived_at = self.clock()
            log.info("T+%-6.1f %s back", event.revived_at - event.drain_at, ",".join(event.nodes))

    def _observe(self, now: float) -> None:
        watches = [(e, w) for e in self.events for w in e.jobs.values() if w.running_again_at is None]
        if not watches:
            return
        ids = sorted({w.job_id for _e, w in watches})
        try:
            current = {j.job_id: j for j in self.slurm.jobs(job_ids=ids, states="all")}
        except SlurmError as exc:
            log.warning("squeue failed, retrying: %s", exc)
            return
        for event, watch in watches:
            job = current.get(watch.job_id)
            # A job that shrank in place (job/shrink.py) runs on in the same attempt without the nodes.
            shrunk = job is not None and job.running and not set(job.nodes) & set(event.nodes)
            moved = job is None or not job.running or job.restart_count > watch.restarts_before or shrunk
            if watch.left_at is None and moved:
                watch.left_at = now
            if job is None:
                watch.ended = watch.ended or "GONE"
                continue
            if watch.requeued_at is None and job.restart_count > watch.restarts_before:
                watch.requeued_at = now
            if shrunk or (job.running and job.restart_count > watch.restarts_before):
                watch.running_again_at, watch.where = now, job.nodes
                log.info("job %s running again on %s", job.job_id, ",".join(job.nodes))
            elif job.state not in ("RUNNING", "PENDING", "COMPLETING", "REQUEUED", "CONFIGURING"):
                watch.ended = job.state

    def _read_ledger(self) -> None:
        if self.state_dir is None:
            return
        for event in self.events:
            for watch in event.jobs.values():
                _fill_from_ledger(watch, ledger.events(self.state_dir, watch.job_id), event.drain_at)

    # ---------------------------------------------------------------------------------- runs

    def step(self, now: float) -> None:
        """One tick: observe the jobs, then move every event on (drain -> removal -> back)."""
        self._observe(now)  # before acting, so a job seen gone after a removal is timed after it
        for event in self.events:
            self._advance(event, now)

    def run_until_done(self, timeout: float) -> None:
        """Advance every event and observe its jobs until all are back (or ``timeout`` seconds)."""
        self.run_until(lambda: all(e.done for e in self.events), timeout)

    def run_until(self, reached: Callable[[], bool], timeout: float) -> bool:
        """Advance every event and observe its jobs until ``reached()`` holds (True) or ``timeout``
        seconds have passed (False)."""
        end = self.clock() + timeout
        while True:
            now = self.clock()
            self.step(now)
            held = reached()
            if held or now > end:
                break
            self.sleep(self.tick)
        self._read_ledger()
        return held

    def preempt(
        self,
        nodes: Iterable[str],
        grace: float,
        pause: float,
        reason: str = DEFAULT_REASON,
        timeout: float = 600,
    ) -> DrillEvent:
        event = self.start_event(nodes, grace, pause, reason)
        self.run_until_done(grace + pause + timeout)
        return event

    def random(
        self,
        candidates: list[str],
        mtbp: float,
        duration: float,
        grace: float,
        pause: float,
        correlated: int = 1,
        seed: int | None = None,
        reason: str = DEFAULT_REASON,
    ) -> list[DrillEvent]:
        """Poisson preemptions over ``duration`` seconds, each taking ``correlated`` nodes at once."""
        if mtbp <= 0 or duration <= 0 or correlated < 1:
            raise UsageError("--mtbp and --duration must be positive and --correlated at least 1")
        rng = random.Random(seed)
        start = self.clock()
        next_at = start + rng.expovariate(1 / mtbp)
        while self.clock() < start + duration:
            now = self.clock()
            if now >= next_at:
                busy = {n for e in self.events if e.revived_at is None for n in e.nodes}
                free = [n for n in candidates if n not in busy]
                if free:
                    self.start_event(rng.sample(free, min(correlated, len(free))), grace, pause, reason)
                next_at = now + rng.expovariate(1 / mtbp)
            self.step(now)
            self.sleep(self.tick)
        self.run_until_done(grace + pause + 300)
        return self.events


def _fill_from_ledger(watch: JobWatch, events: list[dict], since: float) -> None:
    until = watch.left_at or float("inf")
    for item in events:
        try:
            moment = from_text(item["time"]).timestamp()
        except (KeyError, ValueError):
            continue
        if moment < since - 1:
            continue
        if item["kind"] == "notice_sent" and watch.notified_at is None:
            watch.notified_at = moment
        if item["kind"] == "checkpoint_saved" and moment <= until + 0.5:
            watch.final_checkpoint_at = moment
            watch.final_checkpoint_step = item.get("step")


def nodes_of_job(slurm: Slurm, job_id: str) -> list[str]:
    job = slurm.job(job_id)
    if job is None or not job.running:
        raise UsageError(f"job {job_id} is not running: nothing to drill")
    return list(job.nodes)


def summary(events: list[DrillEvent]) -> dict:
    watches = [(e, w) for e in events for w in e.jobs.values()]
    back = [w.running_again_at - w.left_at for _e, w in watches if w.running_again_at and w.left_at]
    saved = [w for e, w in watches if w.verdict(e.removed_at).startswith("saved")]
    return {
        "events": len(events),
        "jobs_hit": len(watches),
        "saved_by_notice": len(saved),
        "median_seconds_to_running_again": sorted(back)[len(back) // 2] if back else None,
    }


def drill_text(events: list[DrillEvent]) -> str:
    """What ``slurm-preempt drill`` prints: each event, each job it hit and its verdict, the summary."""
    lines = []
    for event in (e.to_json() for e in events):
        lines.append(
            f"{','.join(event['nodes'])}: drained {event['drained_at']}, "
            f"removed {event['removed_at']}, back {event['back_at']}"
        )
        for job in event["jobs"]:
            lines.append(
                f"  job {job['job_id']}: notified {job['notified_at'] or '-'}, final checkpoint "
                f"{job['final_checkpoint_at'] or '-'}, left {job['left_at'] or '-'}, requeued "
                f"{job['requeued_at'] or '-'}, running again {job['running_again_at'] or '-'} on "
                f"{','.join(job['where']) or '-'}"
            )
            lines.append(f"    {job['verdict']}")
    totals = summary(events)
    median = totals["median_seconds_to_running_again"]
    lines.append(
        f"summary: {totals['events']} event(s), {totals['jobs_hit']} job(s) hit, "
        f"{totals['saved_by_notice']} saved by the notice"
        + (f", median {median:.1f} s from leaving to running again" if median is not None else "")
    )
    return "\n".join(lines) + "\n"
