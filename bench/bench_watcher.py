"""Drain watcher figures: notice latency, time to run again after a requeue, poll cost at 10,000 nodes.

    .venv/bin/python bench/bench_watcher.py [--quick]      (root, Slurm installed)

1. Notice latency: drain command to the job's USR1 handler running, watcher polling every 1 s, over
   >= 20 drains (5 in quick mode). Baseline: the poll interval.
2. Time from a requeue to the job running again, with the watcher's fast restart (several runs), and
   without it (Slurm's BeginTime wait, ~121 s; measured once, full mode only).
3. Poll cost with 10,000 nodes: a separate slurmctld whose slurm.conf declares 10,000 nodes with no
   slurmd behind them. CPU per poll (watcher + the Slurm commands it runs) against the bare
   ``sinfo`` query it makes, and queries per poll against the 6-node cluster.

Each part starts its own cluster under /tmp/watcher-bench-* on ports 19500.. and 19520.. (from
$SP_BENCH_PORT when set, to run beside another engineer's bench) and stops it.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from slurm_preempt.rehearsal import procs  # noqa: E402
from slurm_preempt.rehearsal import testcluster as tc  # noqa: E402
from slurm_preempt.rehearsal.clusterspec import BENCH_PORT  # noqa: E402
from slurm_preempt.slurm import parse  # noqa: E402
from slurm_preempt.slurm.commands import Slurm  # noqa: E402
from slurm_preempt.watch.loop import run as run_loop  # noqa: E402
from slurm_preempt.watch.sentstate import SentState  # noqa: E402
from slurm_preempt.watch.settings import Settings  # noqa: E402
from slurm_preempt.watch.watcher import NODE_STATES, Watcher, load_sent, state_path  # noqa: E402

PORT = int(os.environ.get("SP_BENCH_PORT", str(BENCH_PORT + 100)))
SMALL_DIR = Path(f"/tmp/watcher-bench-small-{PORT}")
BIG_DIR = Path(f"/tmp/watcher-bench-10k-{PORT}")
REASON = "TogetherPreemptionNotified: bench"
JOB = """#!/bin/bash
trap 'date +%s.%N >> {work}/usr1-$SLURM_JOB_ID' USR1
echo start >> {work}/start-$SLURM_JOB_ID
while true; do sleep 300 & wait $!; done
"""


def _row(name, value, unit, baseline, target):
    ratio = round(value / baseline, 3) if isinstance(baseline, (int, float)) and baseline else None
    return {
        "name": name,
        "value": round(value, 3),
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
    }


def _wait(predicate, timeout, interval=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("bench: condition not met in time")


def _percentile(values, pct):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))]


class SmallCluster:
    """The 6-node local cluster with a watcher loop in a thread at a 1 s poll."""

    def __enter__(self):
        tc.down(SMALL_DIR)
        spec = tc.ClusterSpec(directory=SMALL_DIR, port=PORT, standard=2, preemptible=4, cpus=16)
        self.state = tc.up(spec, timeout=120)
        os.environ.update(self.state.env())
        self.work = SMALL_DIR / "work"
        self.work.mkdir(exist_ok=True)
        self.script = self.work / "job.sh"
        self.script.write_text(JOB.format(work=self.work))
        self.slurm = Slurm(timeout=20)
        return self

    def __exit__(self, *exc):
        tc.down(SMALL_DIR)

    def start_watcher(self, **settings):
        values = {"grace": 60.0, "interval": 1.0, **settings}
        self.watcher = production_watcher(self.state.spec.state_dir, Settings(**values))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=run_loop, args=(self.watcher,), kwargs={"stop": self.stop})
        self.thread.start()

    def stop_watcher(self):
        self.stop.set()
        self.thread.join(30)

    def submit(self, node: str | None) -> str:
        """One job on ``node`` (None: on any preemptible node); returns once it runs."""
        where = f"--nodelist={node}" if node else "--constraint=preemptible"
        args = [f"--chdir={self.work}", "--requeue", "--output=/dev/null", where]
        job_id = self.slurm.submit(str(self.script), [*args, "--comment=slurm-preempt:signal=USR1"])
        _wait(lambda: (self.work / f"start-{job_id}").exists(), 30)
        return job_id


def production_watcher(state_dir: Path, settings: Settings) -> Watcher:
    """As `slurm-preempt watch --cluster` makes it: state on disk, signals sent by detached helpers."""
    sent = load_sent(state_path(state_dir))
    return Watcher(Slurm(timeout=20), settings, sent, state_dir, detached=True)


def notice_latency(cluster: SmallCluster, drains: int) -> list[float]:
    nodes = [n for n in cluster.state.spec.node_names if n.startswith("pre")]
    latencies = []
    for i in range(drains):
        node = nodes[i % len(nodes)]
        job_id = cluster.submit(node)
        marker = cluster.work / f"usr1-{job_id}"
        time.sleep(random.uniform(0, 1))  # drain at a random phase of the watcher's 1 s poll
        began = time.time()
        cluster.slurm.drain([node], REASON)
        stamp = _wait(lambda m=marker: m.exists() and m.read_text().strip(), 30)
        latencies.append(float(stamp.split()[0]) - began)
        cluster.slurm.cancel(job_id)
        cluster.slurm.resume([node])
        # The watcher must see the node back in service first, so that the next drain is a new event.
        _wait(lambda n=node: n not in cluster.watcher.sent.events, 10)
    return latencies


def resume_after_requeue(cluster: SmallCluster, runs: int) -> list[float]:
    """As in a preemption: the node drains, the watcher tells the job, the job requeues itself (as the
    scripts of `slurm-preempt sbatch` do); from that requeue to the job running again elsewhere. The
    watcher releases only jobs it told to leave a node still away (else Slurm's hold stays)."""
    times = []
    for _ in range(runs):
        job_id = cluster.submit(None)
        node = cluster.slurm.job(job_id).nodes[0]
        cluster.slurm.drain([node], REASON)
        _wait(lambda j=job_id: (cluster.work / f"usr1-{j}").exists(), 30)
        starts = cluster.work / f"start-{job_id}"
        began = time.time()
        cluster.slurm.requeue(job_id)
        _wait(lambda p=starts: len(p.read_text().splitlines()) >= 2, 300, 0.05)
        times.append(time.time() - began)
        cluster.slurm.cancel(job_id)
        cluster.slurm.resume([node])
        _wait(lambda n=node: n not in cluster.watcher.sent.events, 10)
    return times


def small_cluster_rows(quick: bool) -> tuple[list[dict], float]:
    rows = []
    with SmallCluster() as cluster:
        if not quick:
            job_id = cluster.submit("pre1")
            began = time.time()
            cluster.slurm.requeue(job_id)
            _wait(lambda: len((cluster.work / f"start-{job_id}").read_text().splitlines()) >= 2, 300, 0.2)
            without = time.time() - began
            cluster.slurm.cancel(job_id)
        else:
            without = None
        cluster.start_watcher()
        try:
            lat = notice_latency(cluster, 5 if quick else 20)
            fast = resume_after_requeue(cluster, 3 if quick else 6)
        finally:
            cluster.stop_watcher()
        queries = max(cluster.watcher.poll_once().queries for _ in range(3))
        told, correlated = correlated_poll(cluster, per_node=8 if quick else 15)
    rows.append(
        _row(f"notice latency p50 ({len(lat)} drains, 1 s poll)", statistics.median(lat), "s", 1.0, "-")
    )
    rows.append(
        _row(f"notice latency p99 ({len(lat)} drains, 1 s poll)", _percentile(lat, 99), "s", 1.0, "<= 2")
    )
    rows.append(_row("notice latency max", max(lat), "s", 1.0, "-"))
    rows.append(
        _row(
            f"requeue to running, fast restart (median of {len(fast)})",
            statistics.median(fast),
            "s",
            round(without, 1) if without else "~121 (Slurm BeginTime; full mode measures it)",
            "<= 5",
        )
    )
    if without:
        rows.append(_row("requeue to running, Slurm alone", without, "s", without, "-"))
    rows.append(
        _row(
            f"one poll telling {told} jobs on 4 nodes drained at once",
            correlated,
            "s",
            1.0,
            "<= 1 (interval + 1 s)",
        )
    )
    return rows, queries


def correlated_poll(cluster: SmallCluster, per_node: int) -> tuple[int, float]:
    """Correlated preemption: all preemptible nodes drained in one command, then one poll."""
    pre = [n for n in cluster.state.spec.node_names if n.startswith("pre")]
    jobs = [cluster.submit(node) for node in pre for _ in range(per_node)]
    state_dir = cluster.state.spec.state_dir / "correlated"
    watcher = production_watcher(state_dir, Settings(grace=60.0))
    watcher.poll_once()
    cluster.slurm.drain(pre, REASON)
    began = time.monotonic()
    result = watcher.poll_once()
    took = time.monotonic() - began
    cluster.slurm.cancel_many(jobs)
    cluster.slurm.resume(pre)
    return result.actions.get("signal_sent", 0), took


# ---------------------------------------------------------------------------------------- 10,000 nodes


def start_big() -> list[procs.Started]:
    """munged + slurmctld with 10,000 nodes declared and no slurmd (they stay UNKNOWN/DOWN)."""
    shutil.rmtree(BIG_DIR / "state", ignore_errors=True)  # a fresh controller, no old cluster name
    for sub in ("etc", "log", "run", "state", "munge"):
        (BIG_DIR / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(BIG_DIR, 0o755)
    os.chmod(BIG_DIR / "munge", 0o755)
    key = BIG_DIR / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
    d = BIG_DIR
    node = f"NodeHostname=localhost NodeAddr=127.0.0.1 Port={PORT + 29} CPUs=1 RealMemory=100 State=UNKNOWN"
    conf = [
        "ClusterName=bigbench",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={PORT + 20}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={d}/munge/munge.socket",
        f"StateSaveLocation={d}/state",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        "ProctrackType=proctrack/linuxproc",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
        f"NodeName=b[00001-05000] {node} Features=preemptible",
        f"NodeName=b[05001-10000] {node} Features=standard",
        "PartitionName=big Nodes=ALL Default=YES State=UP",
    ]
    (d / "etc" / "slurm.conf").write_text("\n".join(conf) + "\n")
    env = {"PATH": tc.SYSTEM_PATH, "SLURM_CONF": str(d / "etc" / "slurm.conf")}
    munged = procs.start(
        "munged",
        [tc._which("munged"), "-F", "--force", f"--socket={d}/munge/munge.socket", f"--key-file={key}",
         f"--log-file={d}/log/munged.log", f"--pid-file={d}/munge/munged.pid", f"--seed-file={d}/munge/seed"],
        env,
        d / "log" / "munged.out",
    )  # fmt: skip
    _wait(lambda: (d / "munge" / "munge.socket").exists(), 10)
    ctld = procs.start("slurmctld", [tc._which("slurmctld"), "-D", "-i"], env, d / "log" / "slurmctld.out")
    started = [munged, ctld]
    slurm = Slurm(env={**os.environ, "SLURM_CONF": env["SLURM_CONF"]}, timeout=30)
    try:
        _wait(lambda: len(slurm.nodes()) >= 10_000 if slurm.ping() else False, 90, 0.5)
    except BaseException:
        stop_big(started)
        raise
    return started


def stop_big(started: list[procs.Started]) -> None:
    live = [p for p in (s.process() for s in started) if p is not None]
    procs.stop(live, grace=10)


def _cpu() -> float:
    own = time.process_time()
    kids = os.times()
    return own + kids.children_user + kids.children_system


def big_rows(quick: bool, small_queries: int) -> list[dict]:
    started = start_big()
    rounds = 5 if quick else 20
    try:
        env = {**os.environ, "SLURM_CONF": str(BIG_DIR / "etc" / "slurm.conf")}
        slurm = Slurm(env=env, timeout=60)
        slurm.drain([f"b{i:05d}" for i in range(1, 101)], REASON)  # 100 preemptible nodes draining
        watcher = Watcher(slurm, Settings(grace=300, interval=5), SentState(), BIG_DIR / "sp-state")
        first = watcher.poll_once()  # opens the 100 events (one squeue for their jobs)
        cpu, wall, queries = [], [], []
        for _ in range(rounds):
            c0, w0 = _cpu(), time.monotonic()
            result = watcher.poll_once()
            cpu.append(_cpu() - c0)
            wall.append(time.monotonic() - w0)
            queries.append(result.queries)
        bare, every_node = [], []
        argv = ["sinfo", "-h", "-N", "-O", parse.format_arg(parse.NODE_FIELDS)]
        for _ in range(rounds):
            c0 = _cpu()
            slurm.run([*argv, "-t", NODE_STATES])  # the query the watcher makes
            c1 = _cpu()
            slurm.run(argv)  # every node, for comparison
            bare.append(c1 - c0)
            every_node.append(_cpu() - c1)
    finally:
        stop_big(started)
    poll_cpu, bare_cpu = statistics.median(cpu), statistics.median(bare)
    return [
        _row("poll CPU at 10,000 nodes (median)", poll_cpu, "s", round(bare_cpu, 4), "-"),
        _row(
            "poll wall time at 10,000 nodes (median)", statistics.median(wall), "s", round(bare_cpu, 4), "-"
        ),
        _row(
            "same sinfo for all 10,000 nodes, not drained only (median CPU)",
            statistics.median(every_node),
            "s",
            round(bare_cpu, 4),
            "-",
        ),
        _row("first poll at 10,000 nodes: new drain events", len(first.new_events), "nodes", 100, "-"),
        _row("queries per poll at 10,000 nodes", max(queries), "queries", small_queries, "= 6-node figure"),
    ]


def run(quick: bool = False) -> list[dict]:
    if os.geteuid() != 0:
        raise RuntimeError("bench_watcher needs root (it starts local Slurm daemons)")
    rows, small_queries = small_cluster_rows(quick)
    return rows + big_rows(quick, small_queries)


if __name__ == "__main__":
    import benchargs  # beside this file: sys.path[0] when run as a script

    for row in run(quick=benchargs.quick(__doc__)):
        print(row)
