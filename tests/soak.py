"""A cluster that churns for as long as asked around one watcher and the in-memory Slurm: jobs come, run,
are preempted, requeue themselves, are restarted fast and end; nodes drain, some go down, all come back;
now and then Slurm does not answer. Seeded and on an injected clock: the same run every time.

Used by the soak test (tests/test_watcher_soak.py) and by bench/bench_watcher.py, which prints what it
measures after 1,000 and 100,000 polls.
"""

from __future__ import annotations

import gc
import os
import random
import shutil
import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

from fakeslurm import Clock, FakeSlurm
from slurm_preempt.errors import SlurmError
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.watcher import Watcher, load_sent, state_path

OPTED = "slurm-preempt:signal=USR1"
REASON = "TogetherPreemptionNotified: soak"
FALLBACK = "slurm-preempt:fallback-after=3"
STEP = 5.0  # seconds of cluster life per poll (the default interval)


@dataclass(frozen=True)
class Sample:
    polls: int
    rss_mib: float  # resident memory of this process
    objects: int  # objects the garbage collector tracks (after a collection)
    poll_cpu_ms: float  # median CPU time per poll over the last window
    state_entries: int  # what the watcher keeps between polls: events + told + restarts


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Churn:
    def __init__(self, state_dir: Path, seed: int = 1, nodes: int = 16, jobs: int = 48, window: int = 1000):
        self.random = random.Random(seed)
        self.clock = Clock()
        self.slurm = FakeSlurm(self.clock, preemptible=nodes, standard=4, keep_calls=64)
        self.state_dir = state_dir
        settings = Settings(grace=300, interval=STEP, enforce=True)
        sent = load_sent(state_path(state_dir))
        self.watcher = Watcher(self.slurm, settings, sent, state_dir, clock=self.clock)
        self.target_jobs = jobs
        self.next_id = 1000
        self.polls = 0
        self.failed_polls = 0
        self.told: set[str] = set()  # signalled: they requeue themselves at the next step
        self.away: dict[str, int] = {}  # node -> step it was drained
        self.cpu: deque[float] = deque(maxlen=window)
        self.actions: Counter[str] = Counter()
        self.most_queries = 0  # Slurm queries in one poll, at most
        self.signalled: dict[str, Counter[int]] = {}  # live job -> signals sent per attempt
        self.most_signals = 0  # in one attempt of one job
        self.slurm.on_signal = self._heard

    # ------------------------------------------------------------------------------------ one step

    def step(self) -> None:
        began = time.process_time()
        try:
            result = self.watcher.poll_once()
            self.actions.update(result.actions)
            self.most_queries = max(self.most_queries, result.queries)
        except SlurmError:
            self.failed_polls += 1  # the loop would back off; here the cluster just goes on
        self.cpu.append(time.process_time() - began)
        self.polls += 1
        self.clock.advance(STEP)
        self._jobs_leave()
        self._nodes_change()
        self._jobs_start_and_end()
        if self.random.random() < 1 / 500:
            self.slurm.fail_next("nodes")

    def run(self, polls: int, sample_at: set[int]) -> list[Sample]:
        samples = []
        while self.polls < polls:
            self.step()
            if self.polls in sample_at:
                samples.append(self.sample())
        return samples

    def sample(self) -> Sample:
        gc.collect()
        sent = self.watcher.sent
        return Sample(
            polls=self.polls,
            rss_mib=rss_mib(),
            objects=len(gc.get_objects()),
            poll_cpu_ms=statistics.median(self.cpu) * 1000,
            state_entries=len(sent.events) + len(sent.told) + len(sent.restarts),
        )

    # ------------------------------------------------------------------------------------ the cluster

    def _heard(self, names: list[str]) -> None:
        for name in names:
            job = next(j for j in self.slurm.job_table.values() if j.display_id == name)
            heard = self.signalled.setdefault(job.job_id, Counter())
            heard[job.restart_count] += 1
            self.most_signals = max(self.most_signals, heard[job.restart_count])
        self.told.update(names)

    def _jobs_leave(self) -> None:
        """Jobs told last step took their final checkpoint and requeued themselves."""
        for name in sorted(self.told):
            job_id = next((j.job_id for j in self.slurm.job_table.values() if j.display_id == name), None)
            if job_id is not None and self.slurm.job(job_id).state == "RUNNING":
                self.slurm.requeue_by_job(job_id)
        self.told.clear()

    def _nodes_change(self) -> None:
        up = [n for n, node in self.slurm.node_table.items() if n.startswith("pre") and n not in self.away]
        if up and self.random.random() < 1 / 40:
            node = self.random.choice(up)
            self.slurm.drain([node], REASON)
            self.away[node] = self.polls
        for node, since in sorted(self.away.items()):
            age = self.polls - since
            if age == 60 and self.random.random() < 0.5:  # removed at the deadline: its jobs fail over
                self._remove(node)
            elif age >= 80 and self.random.random() < 0.2:
                self.slurm.resume([node])
                del self.away[node]

    def _remove(self, node: str) -> None:
        self.slurm.set_down([node], "Not responding")
        for job in list(self.slurm.job_table.values()):
            if node in job.nodes and job.state == "RUNNING":
                self.slurm.requeue_by_job(job.job_id)  # NODE_FAIL, then requeued by Slurm

    def _jobs_start_and_end(self) -> None:
        up = [n for n, node in self.slurm.node_table.items() if n not in self.away and n.startswith("pre")]
        for job in list(self.slurm.job_table.values()):
            if job.state == "PENDING" and job.reason != "BeginTime" and up:
                self.slurm.start(
                    job.job_id, self.random.sample(up, min(len(up), self.random.choice((1, 1, 2))))
                )
            elif job.state == "PENDING" and job.reason == "BeginTime" and self.random.random() < 1 / 25:
                job.reason = "Priority"  # Slurm's own ~121 s hold is over
            elif job.state == "RUNNING" and self.random.random() < 1 / 150:
                self._end(job.job_id)
        while len(self.slurm.job_table) < self.target_jobs:
            self.next_id += 1
            comment = self.random.choice((OPTED, OPTED, OPTED, f"{OPTED} {FALLBACK}", ""))
            self.slurm.add_job(str(self.next_id), [], comment, state="PENDING", reason="Priority")

    def _end(self, job_id: str) -> None:
        """The job ended; the site prunes its files (the watcher itself keeps nothing of it)."""
        self.slurm.end(job_id)
        self.signalled.pop(job_id, None)  # the harness keeps nothing of ended jobs either
        shutil.rmtree(self.state_dir / "jobs" / job_id, ignore_errors=True)
        (self.state_dir / "notices" / f"{job_id}.json").unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    """``python tests/soak.py POLLS [SAMPLE ...]``: one JSON line per sample on stdout, then the totals,
    in a process of its own that logs as the CLI does (INFO lines with times, on stderr); the soak test
    and bench/bench_watcher_scale.py run it (the bench with and without MALLOC_ARENA_MAX)."""
    import json
    import tempfile

    from slurm_preempt.cli import _logging

    _logging.configure(0, stamped=True)
    polls = int(argv[0])
    at = {int(a) for a in argv[1:]} or {1_000, polls}
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=shm, prefix="sp-soak-") as folder:
        churn = Churn(Path(folder) / "state")
        began = time.monotonic()
        for sample in churn.run(polls, at):
            print(json.dumps({**sample.__dict__, "seconds": time.monotonic() - began}), flush=True)
        totals = {
            "actions": dict(churn.actions),
            "failed_polls": churn.failed_polls,
            "most_queries": churn.most_queries,
            "most_signals": churn.most_signals,
            "target_jobs": churn.target_jobs,
        }
        print(json.dumps(totals), flush=True)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main(sys.argv[1:])
