"""Pure parsers, fed with output captured from real Slurm (tests/data/slurm-<version>/)."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_preempt import ids
from slurm_preempt.errors import SlurmError, UsageError
from slurm_preempt.slurm import parse

UTC = timezone.utc
DATA = Path(__file__).parent / "data"


def read(data_dir, name, version="22.05") -> bytes:
    """Output as the real Slurm printed it, bytes and all (captured with SLURM_TIME_FORMAT=%s)."""
    return (data_dir / f"slurm-{version}" / name).read_bytes()


def at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def test_nodes_draining_and_down(data_dir):
    nodes = {n.name: n for n in parse.parse_nodes(read(data_dir, "sinfo_nodes.bin"))}
    assert sorted(nodes) == ["pre1", "pre2", "pre3", "pre4", "std1", "std2"]
    pre1 = nodes["pre1"]
    assert pre1.state == "ALLOCATED" and pre1.flags == {"DRAIN"}
    assert pre1.drain and pre1.draining and not pre1.down
    assert pre1.reason == "TogetherPreemptionNotified: node reclaimed"
    assert pre1.reason_time == at(1796139097)
    assert pre1.reason_user == "root"
    assert pre1.has_feature("preemptible")
    pre4 = nodes["pre4"]
    assert pre4.down and not pre4.drain
    assert pre4.reason == "hw fault | ecc"  # a "|" in a reason does not shift columns
    std1 = nodes["std1"]
    assert std1.available and std1.reason == "" and std1.reason_time is None
    assert std1.features == ("standard",)


def test_jobs_running(data_dir):
    jobs = parse.parse_jobs(read(data_dir, "squeue_jobs_running.bin"))
    by_id = {j.job_id: j for j in jobs}
    train = by_id["28070461"]
    assert train.running and train.nodes == ("pre1",) and train.restart_count == 0
    assert train.name == "train | big run"
    assert train.comment == "slurm-preempt:signal=USR1 with spaces | pipes"
    assert train.features == "preemptible" and train.user == "root"
    assert train.display_id == "28070461" and train.array_task_id == ""
    assert train.start_time == at(1796139096) and train.submit_time == at(1796139095)
    task = by_id["28070465"]
    assert task.array_job_id == "28070462" and task.array_task_id == "1"
    assert task.display_id == "28070462_1" and task.comment == ""
    two = by_id["28070463"]
    assert two.nodes == ("std1", "std2") and two.num_nodes == 2


def test_jobs_requeued_pending_begintime(data_dir):
    jobs = {j.job_id: j for j in parse.parse_jobs(read(data_dir, "squeue_jobs_requeued.bin"))}
    train = jobs["28070461"]
    assert train.pending and train.reason == "BeginTime" and train.restart_count == 1
    assert train.nodes == ()
    # Slurm holds a requeued job back ~121 s (cred_expire + 1) after the requeue.
    wait = (train.eligible_time - train.submit_time).total_seconds()
    assert 115 <= wait <= 125


def test_times_are_epoch_seconds_whatever_the_hosts_zone(data_dir, monkeypatch):
    """Finding 9: Slurm times were read in this host's zone. Epoch seconds have none."""
    import time

    for zone in ("UTC", "America/Los_Angeles", "Asia/Kolkata"):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        node = next(n for n in parse.parse_nodes(read(data_dir, "sinfo_nodes.bin")) if n.name == "pre1")
        assert node.reason_time == at(1796139097)
        assert parse.parse_time("2026-12-01T06:13:40") == datetime(2026, 12, 1, 6, 13, 40, tzinfo=UTC)
    monkeypatch.delenv("TZ")
    time.tzset()


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
    assert parse.parse_state(text) == (state, frozenset(flags))


def test_hostlists():
    assert parse.expand_nodes("pre[1-4],std1") == ["pre1", "pre2", "pre3", "pre4", "std1"]
    assert parse.expand_nodes("gpu-preemptible-dp[01-03]") == [
        "gpu-preemptible-dp01",
        "gpu-preemptible-dp02",
        "gpu-preemptible-dp03",
    ]
    assert parse.expand_nodes("(null)") == []
    assert parse.compress_nodes(["pre1", "pre2", "pre3", "std1"]) == "pre[1-3],std1"
    with pytest.raises(UsageError):
        parse.expand_nodes("pre[1-")


@given(st.sets(st.integers(0, 500), min_size=1, max_size=40))
def test_hostlist_roundtrip(numbers):
    names = [f"node{n:03d}" for n in sorted(numbers)]
    assert parse.expand_nodes(parse.compress_nodes(names)) == names


def test_times_and_versions(data_dir):
    assert parse.parse_time("Unknown") is None
    assert parse.parse_time("1796138900") == at(1796138900)
    assert parse.parse_time("9" * 5000) is None and parse.parse_time("²") is None
    assert parse.parse_time("2026-12-01T06:13:40", UTC) == datetime(2026, 12, 1, 6, 13, 40, tzinfo=UTC)
    assert parse.parse_version(read(data_dir, "version.txt").decode()) == (22, 5)
    assert parse.parse_version("slurm-wlm 24.11.5") == (24, 11)
    assert parse.parse_submitted("1234;cluster\n") == "1234"
    with pytest.raises(ValueError):
        parse.parse_submitted("sbatch: error")


# ---------------------------------------------------------------------------------------- hostile bytes

VICTIM = "28070466"


def test_hostile_names_and_comments_captured_from_slurm_stay_data(data_dir):
    """Findings 1 and 2 on real squeue output: another user's job names and comments hold newlines,
    separators, a forged record naming the victim's job on pre1, invalid UTF-8 and the characters
    str.splitlines() breaks at. Exactly the three real jobs come out, each with its own fields."""
    jobs = parse.parse_jobs(read(data_dir, "squeue_jobs_hostile.bin"))
    assert [(j.job_id, j.user, j.nodes) for j in jobs] == [
        (VICTIM, "sp-alice", ("pre2",)),
        ("28070467", "sp-mallory", ("pre1",)),
        ("28070468", "sp-mallory", ("pre1",)),
    ]
    forged = jobs[1]
    assert forged.name.startswith("x\n--partition=batch\x1f\ufffd")  # invalid UTF-8 replaced
    assert forged.comment.startswith("slurm-preempt:signal=USR1\n" + VICTIM + "\x1f")
    assert "\u2028" in jobs[2].name and jobs[2].comment.startswith("\ufffd\ufffd slurm-preempt")


def test_hostile_drain_reason_stays_data(data_dir):
    nodes = {n.name: n for n in parse.parse_nodes(read(data_dir, "sinfo_nodes_hostile.bin"))}
    assert sorted(nodes) == ["pre1", "pre2", "pre3", "pre4", "std1", "std2"]
    assert nodes["pre2"].drain and not nodes["pre3"].drain  # the reason's forged pre3 line is text
    assert nodes["pre2"].reason.startswith("Together\npre3\x1fidle+drain")


SLURM_FIELD = st.sampled_from(["28070466", "N/A", "RUNNING", "pre1", "0", "sp-alice", "batch", "None"])
ANY_BYTES = st.binary(max_size=700)


def _squeue_record(job_id: str, nodes: str, user: str, texts: list[bytes]) -> bytes:
    """One record as squeue prints it for format_arg(JOB_FIELDS, JOB_TEXT_FIELDS): Slurm's fields each
    followed by the separator, then each text field cut or space-padded to its width (no NUL: C)."""
    sep = parse.SEP.encode()
    head = [job_id, job_id, "N/A", "RUNNING", nodes, "0", user, "batch", "1", "1796139096", "1", "1"]
    out = b"".join(field.encode() + sep for field in head)
    for (_name, width), text in zip(parse.JOB_TEXT_FIELDS, texts, strict=True):
        out += text.replace(b"\0", b"")[:width].ljust(width, b" ")
    return out + b"\n"


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(ANY_BYTES, min_size=4, max_size=4), min_size=1, max_size=6))
def test_any_bytes_in_text_fields_never_make_or_move_a_record(texts):
    """Property: whatever bytes users put in reasons, constraints, names and comments (forged records
    and separators included), parsing gives back exactly the jobs Slurm listed, with their own ids,
    nodes and users, and never raises."""
    real = [(str(1000 + i), f"pre{i % 4 + 1}", f"user{i}") for i in range(len(texts))]
    output = b"".join(_squeue_record(*job, fields) for job, fields in zip(real, texts, strict=True))
    jobs = parse.parse_jobs(output)
    assert [(j.job_id, j.nodes[0], j.user) for j in jobs] == real


@settings(max_examples=300)
@given(ANY_BYTES, st.binary(max_size=300))
def test_any_bytes_in_a_reason_never_make_a_node(reason, garbage):
    sep = parse.SEP.encode()
    width = parse.NODE_TEXT_FIELDS[0][1]
    line = sep.join([b"pre1", b"allocated+drain", b"preemptible", b"1796139097", b"root(0)", b""])
    output = line + reason.replace(b"\0", b"")[:width].ljust(width) + b"\n"
    assert [n.name for n in parse.parse_nodes(output)] == ["pre1"]
    # Output that does not frame (not Slurm's) is an error for the whole answer, never a guess.
    try:
        found = parse.parse_nodes(garbage)
    except SlurmError:
        return
    assert all(ids.is_node_name(n.name) for n in found)


@pytest.mark.parametrize(
    "job_id",
    ["424242x", "--partition=batch", "../../..", "²", "1 2", "12,13", "-1", "1_2_3", "123_[1-3]", "9" * 11],
)
def test_records_whose_slurm_fields_are_not_slurms_are_refused_alone(job_id, caplog):
    good = _squeue_record("77", "pre1", "alice", [b"", b"", b"", b""])
    bad = _squeue_record(job_id, "pre1", "mallory", [b"", b"", b"", b""])
    with caplog.at_level(logging.WARNING):
        jobs = parse.parse_jobs(good + bad + good.replace(b"77", b"78", 2))
    assert [j.job_id for j in jobs] == ["77", "78"]
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


@pytest.mark.parametrize("nodes", ["pre[1", "pre1,--all", "@group", "pre[1-9999999]", "a b"])
def test_a_record_with_a_bad_node_list_is_refused_alone(nodes):
    jobs = parse.parse_jobs(_squeue_record("77", nodes, "mallory", [b""] * 4))
    assert jobs == []


# ---------------------------------------------------------------------------------------- every release
# The same scenes captured on each release CI runs (scripts/capture-slurm-data.py, which runs
# tests/data/capture.sh on a test cluster of that release): the literal figures above are 22.05's, the
# tests below hold for every release.

RELEASES = sorted(p.name.removeprefix("slurm-") for p in DATA.glob("slurm-*") if (p / "version.txt").exists())
each_release = pytest.mark.parametrize("release", RELEASES)


def test_every_supported_release_has_captured_output():
    assert RELEASES == ["22.05", "24.11", "25.11", "26.05"]


@each_release
def test_release_version(data_dir, release):
    major, minor = (int(x) for x in release.split("."))
    assert parse.parse_version(read(data_dir, "version.txt", release).decode()) == (major, minor)


@each_release
def test_release_nodes(data_dir, release):
    nodes = {n.name: n for n in parse.parse_nodes(read(data_dir, "sinfo_nodes.bin", release))}
    assert sorted(nodes) == ["pre1", "pre2", "pre3", "pre4", "std1", "std2"]
    pre1 = nodes["pre1"]
    assert pre1.draining and not pre1.down and pre1.flags == {"DRAIN"}
    assert pre1.reason == "TogetherPreemptionNotified: node reclaimed"
    assert pre1.reason_time is not None and pre1.reason_user == "root"
    assert nodes["pre4"].down and nodes["pre4"].reason == "hw fault | ecc"
    assert nodes["std1"].available and nodes["std1"].features == ("standard",)


@each_release
def test_release_jobs(data_dir, release):
    jobs = parse.parse_jobs(read(data_dir, "squeue_jobs_running.bin", release))
    assert len(jobs) == 5 and all(j.running for j in jobs)
    train = next(j for j in jobs if j.name == "train | big run")
    assert train.comment == "slurm-preempt:signal=USR1 with spaces | pipes"
    assert train.nodes == ("pre1",) and train.features == "preemptible" and train.user == "root"
    tasks = sorted((j for j in jobs if j.array_task_id), key=lambda j: j.array_task_id)
    assert [t.array_task_id for t in tasks] == ["0", "1", "2"]
    # One task runs with the array's own job id: naming it alone would name the whole array.
    assert [t.job_id == t.array_job_id for t in tasks] == [False, False, True]
    two = next(j for j in jobs if j.name == "two")
    assert two.nodes == ("std1", "std2") and two.num_nodes == 2


@each_release
def test_release_requeued_job_waits_begintime(data_dir, release):
    jobs = parse.parse_jobs(read(data_dir, "squeue_jobs_requeued.bin", release))
    train = next(j for j in jobs if j.name == "train | big run")
    assert train.pending and train.reason == "BeginTime" and train.restart_count == 1 and train.nodes == ()
    # SubmitTime is reset to the requeue; the job may start cred_expire + 1 s later (whole seconds: ±1).
    assert 120 <= (train.eligible_time - train.submit_time).total_seconds() <= 122


@each_release
def test_release_hostile_output_stays_data(data_dir, release):
    found = parse.parse_jobs(read(data_dir, "squeue_jobs_hostile.bin", release))
    jobs = sorted(found, key=lambda j: int(j.job_id))  # squeue's order differs between releases
    assert [(j.user, j.nodes) for j in jobs] == [("sp-alice", ("pre2",)), *[("sp-mallory", ("pre1",))] * 2]
    victim = jobs[0].job_id
    assert jobs[1].comment.startswith("slurm-preempt:signal=USR1\n" + victim + "\x1f")  # forged: text
    nodes = {n.name: n for n in parse.parse_nodes(read(data_dir, "sinfo_nodes_hostile.bin", release))}
    assert nodes["pre2"].drain and not nodes["pre3"].drain


EPILOG_CASES = ("completed", "cancelled", "timeout", "failed", "node_fail", "requeued")


def _hook_env(data_dir, release, name):
    text = (data_dir / f"slurm-{release}" / "hook-env" / f"{name}.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@each_release
def test_release_what_epilog_slurmctld_sees(data_dir, release):
    """README's table: the exit code EpilogSlurmctld sees for each way a job ends."""
    envs = {case: _hook_env(data_dir, release, f"epilog_slurmctld_{case}") for case in EPILOG_CASES}
    seen = {case: env["SLURM_JOB_EXIT_CODE2"] for case, env in envs.items()}
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
    assert envs["requeued"]["SLURM_JOB_RESTART_COUNT"] == "1"


@each_release
def test_release_prolog_node_list_variable(data_dir, release):
    env = _hook_env(data_dir, release, "prolog_slurmd")
    assert env["SLURM_NODELIST"] == "pre1" and env["SLURM_JOB_RESTART_COUNT"] == "0"
    assert ("SLURM_JOB_NODELIST" in env) == (release != "22.05")  # from 23.02.6


@each_release
def test_release_config(data_dir, release):
    config = parse.parse_config(read(data_dir, "scontrol_show_config.txt", release).decode())
    assert config["SLURM_VERSION"].startswith(release + ".")
    assert config["ClusterName"] == "sptest" and parse.scheduler_parameters(config) == {}
    # MaxBatchRequeue is a setting from 23.02 (before: fixed at 5).
    assert config.get("MaxBatchRequeue") == (None if release == "22.05" else "5")


def test_scheduler_parameters():
    config = {"SchedulerParameters": "bf_continue,requeue_delay=10,enable_expedited_requeue"}
    assert parse.scheduler_parameters(config) == {
        "bf_continue": "",
        "requeue_delay": "10",
        "enable_expedited_requeue": "",
    }
