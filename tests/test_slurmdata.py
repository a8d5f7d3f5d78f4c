"""Pure parsers, fed with output captured from real Slurm (tests/data/slurm-<version>/)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_preempt.errors import UsageError
from slurm_preempt.slurm import parse as slurmdata

UTC = timezone.utc


def read(data_dir, name, version="22.05"):
    return (data_dir / f"slurm-{version}" / name).read_text()


def test_nodes_draining_and_down(data_dir):
    nodes = {n.name: n for n in slurmdata.parse_nodes(read(data_dir, "sinfo_nodes.txt"), UTC)}
    assert sorted(nodes) == ["pre1", "pre2", "pre3", "pre4", "std1", "std2"]
    pre1 = nodes["pre1"]
    assert pre1.state == "ALLOCATED" and pre1.flags == {"DRAIN"}
    assert pre1.drain and pre1.draining and not pre1.down
    assert pre1.reason == "TogetherPreemptionNotified: node reclaimed"
    assert pre1.reason_time == datetime(2026, 12, 1, 6, 13, 40, tzinfo=UTC)
    assert pre1.reason_user == "root"
    assert pre1.has_feature("preemptible")
    pre4 = nodes["pre4"]
    assert pre4.down and not pre4.drain
    assert pre4.reason == "hw fault | ecc"  # a "|" in a reason does not shift columns
    std1 = nodes["std1"]
    assert std1.available and std1.reason == "" and std1.reason_time is None
    assert std1.features == ("standard",)


def test_nodes_after_removal(data_dir):
    nodes = {n.name: n for n in slurmdata.parse_nodes(read(data_dir, "sinfo_nodes_removed.txt"), UTC)}
    assert nodes["pre1"].down and nodes["pre1"].drain
    assert nodes["pre2"].state == "MIXED" and nodes["pre2"].available


def test_jobs_running(data_dir):
    jobs = slurmdata.parse_jobs(read(data_dir, "squeue_jobs_running.txt"), UTC)
    by_id = {j.job_id: j for j in jobs}
    train = by_id["28053808"]
    assert train.running and train.nodes == ("pre1",) and train.restart_count == 0
    assert train.name == "train | big run"
    assert train.comment == "slurm-preempt:notify=USR1; with spaces | pipes"
    assert train.features == "preemptible" and train.user == "root"
    assert train.display_id == "28053808" and train.array_task_id == ""
    task = by_id["28053813"]
    assert task.array_job_id == "28053809" and task.array_task_id == "1"
    assert task.display_id == "28053809_1" and task.comment == ""
    two = by_id["28053810"]
    assert two.nodes == ("std1", "std2") and two.num_nodes == 2


def test_jobs_requeued_pending_begintime(data_dir):
    jobs = {j.job_id: j for j in slurmdata.parse_jobs(read(data_dir, "squeue_jobs_requeued.txt"), UTC)}
    train = jobs["28053808"]
    assert train.pending and train.reason == "BeginTime" and train.restart_count == 1
    assert train.nodes == ()
    # Slurm holds a requeued job back ~121 s (cred_expire + 1) after the requeue.
    wait = (train.eligible_time - train.submit_time).total_seconds()
    assert 115 <= wait <= 125


@pytest.mark.parametrize(
    ("text", "state", "flags"),
    [
        ("allocated+drain", "ALLOCATED", {"DRAIN"}),
        ("down+drain", "DOWN", {"DRAIN"}),
        ("idle", "IDLE", set()),
        ("down*", "DOWN", {"NOT_RESPONDING"}),
        ("mixed+drain+not_responding", "MIXED", {"DRAIN", "NOT_RESPONDING"}),
        ("", "UNKNOWN", set()),
    ],
)
def test_parse_state(text, state, flags):
    assert slurmdata.parse_state(text) == (state, frozenset(flags))


def test_hostlists():
    assert slurmdata.expand_nodes("pre[1-4],std1") == ["pre1", "pre2", "pre3", "pre4", "std1"]
    assert slurmdata.expand_nodes("gpu-preemptible-dp[01-03]") == [
        "gpu-preemptible-dp01",
        "gpu-preemptible-dp02",
        "gpu-preemptible-dp03",
    ]
    assert slurmdata.expand_nodes("(null)") == []
    assert slurmdata.compress_nodes(["pre1", "pre2", "pre3", "std1"]) == "pre[1-3],std1"
    with pytest.raises(UsageError):
        slurmdata.expand_nodes("pre[1-")


@given(st.sets(st.integers(0, 500), min_size=1, max_size=40))
def test_hostlist_roundtrip(numbers):
    names = [f"node{n:03d}" for n in sorted(numbers)]
    assert slurmdata.expand_nodes(slurmdata.compress_nodes(names)) == names


def test_times_and_versions(data_dir):
    assert slurmdata.parse_time("Unknown") is None
    assert slurmdata.parse_time("2026-12-01T06:13:40", UTC) == datetime(2026, 12, 1, 6, 13, 40, tzinfo=UTC)
    assert slurmdata.parse_version(read(data_dir, "version.txt")) == (22, 5)
    assert slurmdata.parse_version("slurm-wlm 24.11.5") == (24, 11)
    assert slurmdata.parse_submitted("1234;cluster\n") == "1234"
    with pytest.raises(ValueError):
        slurmdata.parse_submitted("sbatch: error")


def test_accounting_rows():
    text = (
        "55|55|NODE_FAIL|0:0|2026-12-01T06:00:00|2026-12-01T06:00:02|2026-12-01T06:05:00|1|pre1|batch|"
        "alice|preemptible|billing=8,cpu=8,gres/gpu=8,mem=4000M,node=1\n"
        "55|55|COMPLETED|0:0|2026-12-01T06:05:01|2026-12-01T06:07:03|2026-12-01T06:30:00|1|pre2|batch|"
        "alice|preemptible|billing=8,cpu=8,gres/gpu=8,mem=4000M,node=1\n"
        "56|56|CANCELLED by 0|0:15|2026-12-01T06:00:00|None|2026-12-01T06:01:00|1|None assigned|batch|"
        "bob||\n"
    )
    rows = slurmdata.parse_acct(text, UTC)
    assert [r.state for r in rows] == ["NODE_FAIL", "COMPLETED", "CANCELLED"]
    assert rows[0].gpus == 8 and rows[0].cpus == 8 and rows[0].nodes == ("pre1",)
    assert rows[2].start is None and rows[2].constraints == ""
