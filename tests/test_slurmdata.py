"""Pure parsers, fed with output captured from real Slurm (tests/data/slurm-<version>/)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_preempt.errors import UsageError
from slurm_preempt.slurm import parse as slurmdata

UTC = timezone.utc
DATA = Path(__file__).parent / "data"


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


# ---------------------------------------------------------------------------------------- every release
# The same scene captured on each release (scripts/capture-slurm-data.py): pre1 draining under a job
# whose name and comment hold "|", pre4 down with a "|" in its reason, a 3-task array, a 2-node job; then
# pre1 removed and its job requeued.

RELEASES = sorted(p.name.removeprefix("slurm-") for p in DATA.glob("slurm-*") if (p / "version.txt").exists())
each_release = pytest.mark.parametrize("release", RELEASES)


@each_release
def test_release_version(data_dir, release):
    major, minor = (int(x) for x in release.split("."))
    assert slurmdata.parse_version(read(data_dir, "version.txt", release)) == (major, minor)


@each_release
def test_release_nodes(data_dir, release):
    nodes = {n.name: n for n in slurmdata.parse_nodes(read(data_dir, "sinfo_nodes.txt", release), UTC)}
    assert sorted(nodes) == ["pre1", "pre2", "pre3", "pre4", "std1", "std2"]
    pre1 = nodes["pre1"]
    assert pre1.draining and not pre1.down and pre1.flags == {"DRAIN"}
    assert pre1.reason == "TogetherPreemptionNotified: node reclaimed"
    assert pre1.reason_time is not None and pre1.reason_user == "root"
    assert nodes["pre4"].down and nodes["pre4"].reason == "hw fault | ecc"
    assert nodes["pre3"].available and nodes["pre3"].reason == "" and nodes["pre3"].reason_time is None
    assert nodes["std1"].features == ("standard",)
    removed = {
        n.name: n for n in slurmdata.parse_nodes(read(data_dir, "sinfo_nodes_removed.txt", release), UTC)
    }
    assert removed["pre1"].down and removed["pre1"].drain and removed["pre1"].reason == "removed"


@each_release
def test_release_jobs(data_dir, release):
    jobs = slurmdata.parse_jobs(read(data_dir, "squeue_jobs_running.txt", release), UTC)
    assert len(jobs) == 5 and all(j.running for j in jobs)
    train = next(j for j in jobs if j.name == "train | big run")
    assert train.comment == "slurm-preempt:notify=USR1; with spaces | pipes"
    assert train.nodes == ("pre1",) and train.features == "preemptible" and train.user == "root"
    tasks = sorted((j for j in jobs if j.array_task_id), key=lambda j: j.array_task_id)
    assert [t.array_task_id for t in tasks] == ["0", "1", "2"]
    # One task runs with the array's own job id: naming it alone would name the whole array.
    assert [t.job_id == t.array_job_id for t in tasks] == [False, False, True]
    assert {t.display_id for t in tasks} == {f"{tasks[0].array_job_id}_{i}" for i in range(3)}
    two = next(j for j in jobs if j.name == "two")
    assert two.nodes == ("std1", "std2") and two.num_nodes == 2


@each_release
def test_release_requeued_job_waits_begintime(data_dir, release):
    jobs = slurmdata.parse_jobs(read(data_dir, "squeue_jobs_requeued.txt", release), UTC)
    train = next(j for j in jobs if j.name == "train | big run")
    assert train.pending and train.reason == "BeginTime" and train.restart_count == 1 and train.nodes == ()
    # SubmitTime is reset to the requeue; the job may start cred_expire + 1 s later.
    assert (train.eligible_time - train.submit_time).total_seconds() == 121


EPILOG_CASES = ("completed", "cancelled", "timeout", "failed", "node_fail", "requeued")


def _hook_env(data_dir, release, name):
    text = (data_dir / f"slurm-{release}" / "hook-env" / f"{name}.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@each_release
def test_release_what_epilog_slurmctld_sees(data_dir, release):
    """README's table: the exit code EpilogSlurmctld sees for each way a job ends."""
    seen = {
        c: _hook_env(data_dir, release, f"epilog_slurmctld_{c}")["SLURM_JOB_EXIT_CODE2"] for c in EPILOG_CASES
    }
    # A node failure is told apart from the job's own exit only from 24.11 on (0:1; 22.05: 0:0).
    node_fail = "0:0" if release == "22.05" else "0:1"
    assert seen == {
        "completed": "0:0",
        "cancelled": "0:0",
        "timeout": "0:0",
        "failed": "3:0",
        "node_fail": node_fail,
        "requeued": "0:0",
    }
    # After `scontrol requeue` the epilog already sees the raised restart count.
    assert _hook_env(data_dir, release, "epilog_slurmctld_requeued")["SLURM_JOB_RESTART_COUNT"] == "1"


@each_release
def test_release_prolog_node_list_variable(data_dir, release):
    env = _hook_env(data_dir, release, "prolog_slurmd")
    assert env["SLURM_NODELIST"] == "pre1" and env["SLURM_JOB_RESTART_COUNT"] == "0"
    assert ("SLURM_JOB_NODELIST" in env) == (release != "22.05")  # from 23.02.6


@each_release
def test_release_config(data_dir, release):
    config = slurmdata.parse_config(read(data_dir, "scontrol_show_config.txt", release))
    assert config["SLURM_VERSION"].startswith(release + ".")
    assert config["ClusterName"] == "sptest" and slurmdata.scheduler_parameters(config) == {}
    # MaxBatchRequeue is a setting from 23.02 (before: fixed at 5).
    assert config.get("MaxBatchRequeue") == (None if release == "22.05" else "5")


def test_scheduler_parameters():
    config = {"SchedulerParameters": "bf_continue,requeue_delay=10,enable_expedited_requeue"}
    assert slurmdata.scheduler_parameters(config) == {
        "bf_continue": "",
        "requeue_delay": "10",
        "enable_expedited_requeue": "",
    }
