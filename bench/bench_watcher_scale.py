"""The watcher at scale and over time: a mass drain, 100,000 polls, a long run on the real cluster.

    .venv/bin/python bench/bench_watcher_scale.py [--quick]            (mass drain: root, Slurm)
    .venv/bin/python bench/bench_watcher_scale.py --real 7200          (a 2-hour run on the real cluster)
    .venv/bin/python bench/bench_watcher_scale.py --generated 200,1000  (only the generated-job drain)

1. Mass drain: 200 opted-in jobs on 10 preemptible nodes, all drained in one command while
   `slurm-preempt watch --cluster --interval 1` runs: drain command to the last job's USR1 handler,
   against one poll interval + 1 s; and how many scancel processes told them (a counting wrapper on
   the watcher's PATH). Quick mode: 100 jobs on 5 nodes. Then 200 and 1,000 one-CPU jobs made by the
   generator on 4 nodes (their batch shells pass the notice on): drain to each command's SIGTERM,
   p50, p99, the last, and how many within poll + 1 s. Quick mode: 200 only.
2. 100,000 polls of a churning cluster against the in-memory Slurm (tests/soak.py): resident memory,
   CPU per poll (median of 1,000 polls) and Python objects after 100,000 polls, next to the same after
   1,000 (the baseline). Quick mode: 20,000 polls.
3. ``--real SECONDS`` (not part of bench/run.py): the CLI watcher at a 1 s interval on the local
   cluster while nodes drain and come back and jobs are told, requeue themselves and are restarted;
   its resident memory and CPU per poll sampled every minute (polls counted from its systemd STATUS
   lines).

Clusters live under /tmp/watcher-scale-<port> on $SP_BENCH_PORT + 30.. (default 19530..; bench_watcher.py
takes the 30 ports below).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

from slurm_preempt.rehearsal import testcluster as tc  # noqa: E402
from slurm_preempt.rehearsal.clusterspec import BENCH_PORT  # noqa: E402
from slurm_preempt.slurm.commands import Slurm  # noqa: E402

sys.path.insert(0, str(HERE))
from bench_watcher import _row, _wait  # noqa: E402  (the rows and waits of the watcher bench)

PORT = int(os.environ.get("SP_BENCH_PORT", str(BENCH_PORT + 100))) + 30
DIR = Path(f"/tmp/watcher-scale-{PORT}")
REASON = "TogetherPreemptionNotified: bench"
OPTED = "--comment=slurm-preempt:signal=USR1"
JOB = """#!/bin/bash
trap 'date +%s.%N >> {work}/usr1-$SLURM_JOB_ID' USR1
echo start >> {work}/start-$SLURM_JOB_ID
while true; do sleep 300 & wait $!; done
"""
# The churn of the long run: told jobs leave (requeue themselves) and come back through fast restart.
LEAVING_JOB = """#!/bin/bash
trap 'scontrol requeue $SLURM_JOB_ID; exit 0' USR1
while true; do sleep 300 & wait $!; done
"""
COUNTING_SCANCEL = """#!/bin/sh
echo "$*" >> {calls}
exec {scancel} "$@"
"""


class Cluster:
    def __init__(self, preemptible: int, cpus: int):
        self.spec = tc.ClusterSpec(directory=DIR, port=PORT, standard=1, preemptible=preemptible, cpus=cpus)

    def __enter__(self):
        tc.down(DIR)
        self.state = tc.up(self.spec, timeout=180)
        os.environ.update(self.state.env())
        self.work = DIR / "work"
        self.work.mkdir(exist_ok=True)
        self.slurm = Slurm(timeout=30)
        self.pre = [n for n in self.spec.node_names if n.startswith("pre")]
        return self

    def __exit__(self, *exc):
        tc.down(DIR)

    def submit(self, text: str, where: str, count: int) -> list[str]:
        """``count`` jobs of ``text`` on node ``where`` (or, when it is not a node, with that constraint)."""
        script = self.work / f"job-{len(text)}.sh"
        script.write_text(text.format(work=self.work))
        place = f"--nodelist={where}" if where in self.pre else f"--constraint={where}"
        args = [f"--chdir={self.work}", "--output=/dev/null", place, "--requeue", OPTED]
        return [self.slurm.submit(str(script), args) for _ in range(count)]

    def watcher(self, log: Path, interval: float, env: dict[str, str] | None = None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "slurm_preempt", "watch", "--cluster", "--interval", f"{interval:g}",
                "--grace", "300", "--allow-preemptible-host", "--state-dir", str(DIR / "state")]  # fmt: skip
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env)  # noqa: SIM115


# ---------------------------------------------------------------------------------------- mass drain


def mass_drain(quick: bool) -> list[dict]:
    nodes, per_node, rounds = (5, 20, 2) if quick else (10, 20, 3)
    with Cluster(preemptible=nodes, cpus=per_node) as cl:
        jobs = [j for node in cl.pre for j in cl.submit(JOB, node, per_node)]
        _wait(lambda: all((cl.work / f"start-{j}").exists() for j in jobs), 300, 0.5)
        calls = cl.work / "scancel.calls"
        wrapper = cl.work / "bin" / "scancel"
        wrapper.parent.mkdir()
        wrapper.write_text(COUNTING_SCANCEL.format(calls=calls, scancel=shutil.which("scancel")))
        wrapper.chmod(0o755)
        env = {**os.environ, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
        watcher = cl.watcher(cl.work / "watch.log", interval=1.0, env=env)
        spans, batches = [], []
        try:
            time.sleep(3)
            for _ in range(rounds):
                for job_id in jobs:
                    (cl.work / f"usr1-{job_id}").unlink(missing_ok=True)
                calls.unlink(missing_ok=True)
                time.sleep(random.uniform(0, 1))  # at a random phase of the 1 s poll
                began = time.time()
                cl.slurm.drain(cl.pre, REASON)
                _wait(lambda: all((cl.work / f"usr1-{j}").exists() for j in jobs), 60, 0.05)
                last = max(float((cl.work / f"usr1-{j}").read_text().split()[0]) for j in jobs)
                spans.append(last - began)
                batches.append(len(calls.read_text().splitlines()))
                cl.slurm.resume(cl.pre)
                time.sleep(3)  # the watcher sees the nodes back: the next drain is a new event
        finally:
            watcher.terminate()
            watcher.wait(30)
    told = len(jobs)
    return [
        _row(
            f"mass drain: {told} jobs on {nodes} nodes, drain -> last USR1 handler (median of {rounds})",
            statistics.median(spans),
            "s",
            2.0,
            "<= 2 (1 s poll + 1 s)",
        ),  # fmt: skip
        _row("mass drain: the slowest of those", max(spans), "s", 2.0, "<= 2"),
        _row(f"mass drain: scancel processes for {told} jobs", max(batches), "calls", told, "batched"),
    ]


def mass_drain_generated(count: int, nodes: int = 4) -> list[dict]:
    """``count`` one-CPU jobs made by the generator (its batch shell passes the notice on as SIGTERM)
    on ``nodes`` preemptible nodes, all drained at once, the cluster watcher at 1 s: drain command to
    each command's SIGTERM handler. One round: the told jobs requeue themselves."""
    from slurm_preempt.config import Config
    from slurm_preempt.sbatch import render as gen

    with Cluster(preemptible=nodes, cpus=-(-count // nodes)) as cl:
        command = ["bash", "-c", TERM_RECORDER.format(work=cl.work)]
        settings = {"checkpoint_dir": str(cl.work / "ckpt"), "job_name": "mass", "grace": "300"}
        script = gen.write_script(gen.generate(settings, command, Config()).script, cl.work / "mass.sh")
        args = [f"--chdir={cl.work}", "--output=/dev/null"]
        jobs = [cl.slurm.submit(str(script), args) for _ in range(count)]
        _wait(lambda: all((cl.work / f"start-{j}").exists() for j in jobs), 600, 0.5)
        watcher = cl.watcher(cl.work / "watch.log", interval=1.0)
        try:
            time.sleep(3 + random.uniform(0, 1))  # at a random phase of the 1 s poll
            began = time.time()
            cl.slurm.drain(cl.pre, REASON)
            _wait(lambda: all((cl.work / f"term-{j}").exists() for j in jobs), 300, 0.2)
            delays = sorted(float((cl.work / f"term-{j}").read_text().split()[0]) - began for j in jobs)
        finally:
            watcher.terminate()
            watcher.wait(30)
    within = sum(d <= 2.0 for d in delays)
    name = f"mass drain, generated jobs: {count} on {nodes} nodes, drain -> command's SIGTERM"
    return [
        _row(f"{name}, p50", statistics.median(delays), "s", 2.0, ""),
        _row(f"{name}, p99", delays[int(0.99 * (len(delays) - 1))], "s", 2.0, ""),
        _row(f"{name}, last", delays[-1], "s", 2.0, "<= 2 (1 s poll + 1 s)"),
        _row(f"{name}, within 2 s", within, "jobs", count, f"{count} of {count}"),
    ]


TERM_RECORDER = (
    "trap 'date +%s.%N > {work}/term-$SLURM_JOB_ID; exit 0' TERM; echo > {work}/start-$SLURM_JOB_ID; "
    "while :; do sleep 300 & wait $!; done"
)


# ---------------------------------------------------------------------------------------- 100,000 polls


def soak(quick: bool) -> list[dict]:
    polls = 20_000 if quick else 100_000
    n = f"{polls:,}"
    rows = []
    for label, extra in (("", {}), (", MALLOC_ARENA_MAX=2", {"MALLOC_ARENA_MAX": "2"})):
        early, late, totals = _soak_process(polls, extra)
        rows += [
            _row(
                f"watcher RSS after {n} polls{label}",
                late["rss_mib"],
                "MiB",
                round(early["rss_mib"], 2),
                "flat (baseline: after 1,000)",
            ),  # fmt: skip
            _row(
                f"CPU per poll after {n} polls, median of 1,000{label}",
                late["poll_cpu_ms"],
                "ms",
                round(early["poll_cpu_ms"], 4),
                "flat (baseline: after 1,000)",
            ),  # fmt: skip
        ]
    rows += [
        _row(f"Python objects after {n} polls", late["objects"], "objects", early["objects"], "flat"),
        _row(
            f"what the watcher keeps after {n} polls",
            late["state_entries"],
            "entries",
            early["state_entries"],
            "bounded by what is open",
        ),  # fmt: skip
        _row(f"{n} polls, wall time", late["seconds"], "s", None, "-"),
        _row(
            f"acts in those {n} polls (notices, signals, restarts, fallbacks)",
            sum(totals["actions"].values()),
            "acts",
            None,
            "-",
        ),  # fmt: skip
    ]
    return rows


def _soak_process(polls: int, extra_env: dict[str, str]) -> tuple[dict, dict, dict]:
    """tests/soak.py in a process of its own: this one's memory does not blur the figure."""
    argv = [sys.executable, str(HERE.parent / "tests" / "soak.py"), str(polls), "1000", str(polls)]
    env = {**os.environ, **extra_env, "PYTHONPATH": str(HERE.parent / "src")}
    out = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True
    ).stdout
    early, late, totals = (json.loads(line) for line in out.splitlines())
    return early, late, totals


# ---------------------------------------------------------------------------------------- the long run


def real_run(seconds: float) -> list[dict]:
    """As the shipped unit runs it (MALLOC_ARENA_MAX=2, systemd's notify socket): the watcher and its
    signal helper sampled every minute."""
    with Cluster(preemptible=4, cpus=16) as cl:
        cl.submit(LEAVING_JOB, "preemptible", 24)
        notify_path = DIR / "notify.sock"
        notify_path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify_path))
        sock.settimeout(0)
        env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "MALLOC_ARENA_MAX": "2"}
        watcher = cl.watcher(DIR / "long-run.log", 1.0, env=env)
        try:
            samples = _sample(cl, watcher.pid, sock, seconds)
        finally:
            watcher.terminate()
            watcher.wait(30)
            sock.close()
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    cpu_per_poll = (last[3] - first[3]) / max(1, last[1] - first[1]) * 1000
    n = f"{last[1]:,}"
    return [
        _row(
            f"long run on the real cluster: watcher RSS after {n} polls",
            last[2],
            "MiB",
            round(first[2], 2),
            "flat (baseline: after the first minute)",
        ),  # fmt: skip
        _row(f"long run: signal helper RSS after {n} polls", last[4], "MiB", round(first[4], 2), "flat"),
        _row("long run: CPU per poll of the watcher process", cpu_per_poll, "ms", None, "-"),
        _row("long run: duration", last[0], "s", None, "-"),
    ]


def _sample(cl: Cluster, pid: int, sock: socket.socket, seconds: float) -> list[tuple]:
    """(seconds, polls, watcher RSS MiB, watcher CPU s, helper RSS MiB) every minute, while a random
    preemptible node drains every minute and comes back 40 s later."""
    import psutil

    proc, polls, samples = psutil.Process(pid), 0, []
    began = last_sample = time.monotonic()
    drained: dict[str, float] = {}
    while time.monotonic() - began < seconds:
        polls += _drain_socket(sock)
        now = time.monotonic()
        for node in [n for n, t in drained.items() if now - t > 40]:
            cl.slurm.resume([node])
            del drained[node]
        if now - last_sample >= 60 or not samples:
            cpu = proc.cpu_times()
            helper = sum(c.memory_info().rss for c in proc.children()) / 2**20
            samples.append(
                (now - began, polls, proc.memory_info().rss / 2**20, cpu.user + cpu.system, helper)
            )
            print(f"long run: {samples[-1]}", file=sys.stderr, flush=True)
            last_sample = now
            up = [n for n in cl.pre if n not in drained]
            if up:
                node = random.choice(up)
                cl.slurm.drain([node], REASON)
                drained[node] = now
        time.sleep(1)
    return samples


def _drain_socket(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            count += sock.recv(4096).startswith(b"STATUS=")
        except BlockingIOError:
            return count


def run(quick: bool = False, sizes: tuple[int, ...] = (200, 1000)) -> list[dict]:
    rows = soak(quick)
    if os.geteuid() != 0:
        raise RuntimeError("the mass drain needs root (it starts local Slurm daemons)")
    generated = [row for count in sizes[: 1 if quick else None] for row in mass_drain_generated(count)]
    return mass_drain(quick) + generated + rows


def _stop(_signum, _frame):
    raise KeyboardInterrupt  # SIGTERM: stop the watcher and the cluster on the way out


if __name__ == "__main__":
    import benchargs  # beside this file: sys.path[0] when run as a script

    signal.signal(signal.SIGTERM, _stop)
    options = benchargs.parser(__doc__)
    options.add_argument("--real", type=float, metavar="SECONDS", help="the long run on the real cluster")
    options.add_argument("--generated", metavar="SIZES", help="only the generated-job drain, e.g. 200,1000")
    args = options.parse_args()
    if args.real is not None:
        results = real_run(args.real)
    elif args.generated:  # only the mass drain of generated jobs, at the sizes given
        sizes = [int(n) for n in args.generated.split(",")]
        results = [row for count in sizes for row in mass_drain_generated(count)]
    else:
        results = run(quick=args.quick)
    for row in results:
        print(row)
