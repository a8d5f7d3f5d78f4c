"""A watcher that runs for months: 100,000 polls (about six days at a 5 s interval) of a churning cluster
against the in-memory Slurm, in about half a minute. Nothing the watcher keeps may grow with the number
of polls: the unbounded query log of an earlier version held ~30 MB after 50,000 polls and made each
poll 60 times slower. bench/bench_watcher.py prints the same figures; the real cluster's long run is
there too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from soak import Churn


@pytest.fixture
def fast_folder(tmp_path):
    """tmpfs when there is one: the run writes ~20,000 small files, each fsync'd."""
    if os.access("/dev/shm", os.W_OK):
        with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="sp-soak-") as folder:
            yield Path(folder)
    else:
        yield tmp_path


@pytest.mark.slow
def test_100000_polls_of_a_churning_cluster_keep_memory_and_time_per_poll_flat(fast_folder):
    churn = Churn(fast_folder / "state")
    early, late = churn.run(100_000, {1_000, 100_000})
    # It churned: thousands of jobs told, requeued, restarted fast, moved to standard nodes.
    assert churn.actions["signal_sent"] > 5_000 and churn.actions["fast_restart"] > 5_000
    assert churn.actions["fallback"] > 50 and churn.failed_polls > 100
    # Each job told once per attempt, whatever happened around it.
    assert churn.most_signals == 1
    # Constant work per poll: at most 3 Slurm queries, whatever the history.
    assert churn.most_queries == 3
    # What the watcher keeps is what is open now (events, jobs told of them, requeued jobs pending).
    assert late.state_entries <= 3 * churn.target_jobs
    # No object accumulates: a leak of one object per poll would show ~99,000 here.
    assert late.objects - early.objects < 1_000, (early, late)
    # Memory and time per poll flat (medians of 1,000 polls of CPU time, generous bounds: the bug this
    # guards against cost x60 in time and ~30 MB).
    assert late.rss_mib - early.rss_mib < 8, (early, late)
    assert late.poll_cpu_ms < 3 * early.poll_cpu_ms, (early, late)
