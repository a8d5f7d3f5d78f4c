"""What the unforgeable squeue framing costs: the watcher's pending-jobs query with fixed-width text fields
(today's format), against the separator-only format it replaced (forgeable) and ``squeue --json``.

    .venv/bin/python bench/bench_squeue_format.py [--jobs 2000] [--rounds 15]

Starts its own cluster under /tmp/squeue-bench on port 18290, submits ``--jobs`` held jobs whose comment
holds opt-in tokens, then runs the three queries alternately ``--rounds`` times and prints the median
wall time and output size of each, as ratios against the separator-only query measured in the same run.
The parse time (Python) of today's format is measured on the same output. Stops the cluster at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from slurm_preempt.rehearsal import testcluster as tc  # noqa: E402
from slurm_preempt.slurm import parse  # noqa: E402

DIRECTORY = Path("/tmp/squeue-bench")
OLD_FIELDS = (*parse.JOB_FIELDS, *(name for name, _ in parse.JOB_TEXT_FIELDS))


def _queries() -> dict[str, list[str]]:
    today = parse.format_arg(parse.JOB_FIELDS, parse.JOB_TEXT_FIELDS)
    before = parse.format_arg(OLD_FIELDS)
    return {
        "separator only (before)": ["squeue", "-h", "-t", "pending", "-O", before],
        "fixed-width text (today)": ["squeue", "-h", "-t", "pending", "-O", today],
        "squeue --json": ["squeue", "-t", "pending", "--json"],
    }


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    began = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, check=True).stdout
    return time.perf_counter() - began, out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    spec = tc.ClusterSpec(directory=DIRECTORY, port=18290, standard=1, preemptible=1, cpus=4)
    state = tc.up(spec, timeout=120)
    env = {**state.env(), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin", **parse.TIME_FORMAT_ENV}
    try:
        comment = "my run slurm-preempt:signal=USR1 slurm-preempt:fallback-after=3"
        for i in range(args.jobs):
            argv = ["sbatch", "--hold", "-J", f"bench-{i}", f"--comment={comment}", "-o", "/dev/null"]
            subprocess.run([*argv, "--wrap", "true"], env=env, capture_output=True, check=True)
        queries = _queries()
        times: dict[str, list[float]] = {name: [] for name in queries}
        sizes: dict[str, int] = {}
        for _round in range(args.rounds):
            for name, argv in queries.items():  # alternated: load changes hit every query alike
                seconds, out = _time(argv, env)
                times[name].append(seconds)
                sizes[name] = len(out)
        _, out = _time(queries["fixed-width text (today)"], env)
        parse_seconds = []
        for _round in range(args.rounds):
            began = time.perf_counter()
            jobs = parse.parse_jobs(out)
            parse_seconds.append(time.perf_counter() - began)
        assert len(jobs) == args.jobs, len(jobs)
        base = statistics.median(times["separator only (before)"])
        rows = {
            name: {
                "median_s": round(statistics.median(values), 4),
                "ratio": round(statistics.median(values) / base, 2),
                "bytes": sizes[name],
            }
            for name, values in times.items()
        }
        rows["parse today's output (python)"] = {"median_s": round(statistics.median(parse_seconds), 4)}
        print(json.dumps({"pending_jobs": args.jobs, "rounds": args.rounds, "results": rows}, indent=1))
    finally:
        tc.down(DIRECTORY)
    return 0


if __name__ == "__main__":
    sys.exit(main())
