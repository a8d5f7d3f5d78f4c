"""A watcher that runs for months: 100,000 polls (about six days at a 5 s interval) of a churning cluster
against the in-memory Slurm, in about twenty seconds. Nothing the watcher keeps may grow with the number
of polls: the unbounded query log of an earlier version held ~30 MB after 50,000 polls and made each
poll 60 times slower. bench/bench_watcher_scale.py prints the same figures; the long run on the real
cluster is there too.

The run is tests/soak.py in a process of its own, logging as the CLI does: this test process's memory
(pytest keeps every log record it captures) must not blur the figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).with_name("soak.py")
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.slow
def test_100000_polls_of_a_churning_cluster_keep_memory_and_time_per_poll_flat():
    argv = [sys.executable, str(SOAK), "100000", "1000", "100000"]
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    quiet = {"stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL, "text": True}
    done = subprocess.run(argv, env=env, check=True, **quiet)
    early, late, totals = (json.loads(line) for line in done.stdout.splitlines())
    actions = totals["actions"]
    # It churned: thousands of jobs told, requeued, restarted fast, moved to standard nodes.
    assert actions["signal_sent"] > 5_000 and actions["fast_restart"] > 5_000
    assert actions["fallback"] > 50 and totals["failed_polls"] > 100
    # Each job told once per attempt, whatever happened around it.
    assert totals["most_signals"] == 1
    # Constant work per poll: at most 4 Slurm queries (3, and the pools' sizes behind the live
    # preemption rate, at most every rate_pool_refresh), whatever the history.
    assert totals["most_queries"] == 4
    # What the watcher keeps is what is open now (events, jobs told of them, requeued jobs pending).
    assert late["state_entries"] <= 3 * totals["target_jobs"]
    # No object accumulates: a leak of one object per poll would show ~99,000 here.
    assert late["objects"] - early["objects"] < 1_000, (early, late)
    # Memory and time per poll flat (medians of 1,000 polls of CPU time; generous bounds: the bug this
    # guards against cost x60 in time and ~30 MB).
    assert late["rss_mib"] - early["rss_mib"] < 8, (early, late)
    assert late["poll_cpu_ms"] < 3 * early["poll_cpu_ms"], (early, late)
