"""slurm/pyslurm_backend.py without pyslurm: the choice of backend (version rule, import failures), the
``sinfo -t``/``squeue -t`` filters, the CLI's widths, and a record pyslurm cannot decode read again
through the CLI. pyslurm's objects are stood in for by plain objects with its attribute names (the
records they give on a real 25.11 cluster are compared with the CLI's in tests/test_pyslurm_cluster.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from slurm_preempt.errors import SlurmError
from slurm_preempt.slurm import pyslurm_backend as pb
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import Job, Node


class Cli(Slurm):
    """The CLI half: the controller's version, and the records it would read for a job or node."""

    def __init__(self, version: str = "25.11.7") -> None:
        super().__init__()
        self.version_text = version
        self.asked: list[tuple[str, dict]] = []

    def config(self) -> dict[str, str]:
        if not self.version_text:
            raise SlurmError(["scontrol"], 1, "no controller")
        return {"SLURM_VERSION": self.version_text}

    def jobs(self, **query):  # type: ignore[override]
        self.asked.append(("jobs", query))
        return [Job(job_id=j, state="RUNNING", name="m\ufffd", nodes=("pre1",)) for j in query["job_ids"]]

    def nodes(self, **query):  # type: ignore[override]
        self.asked.append(("nodes", query))
        return [
            Node(name=n, state="MIXED", flags=frozenset({"DRAIN"}), reason="\ufffd") for n in query["names"]
        ]


class Undecodable:
    """What pyslurm raises when a C string is not UTF-8 (Cython's strict decoding)."""

    def __get__(self, obj, owner=None):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


def fake_job(job_id: int, **fields):
    values = dict(id=job_id, array_id=None, array_task_id=None, state="RUNNING",
                  allocated_nodes="pre[1-2]", requeue_count=0, user_name="alice", partition="batch",
                  num_nodes=2, start_time=1_800_000_000,
                  submit_time=1_799_999_990, eligible_time=1_799_999_990, state_reason="None",
                  constraints=["preemptible"], name="train", comment="slurm-preempt:signal=USR1")  # fmt: skip
    values.update(fields)
    return SimpleNamespace(**values)


def fake_node(name: str, state: str = "MIXED+DRAIN", **fields):
    values = dict(name=name, state=state, available_features=["preemptible"],
                  reason="TogetherPreemptionNotified", reason_time=1_800_000_000,
                  reason_user="root")  # fmt: skip
    values.update(fields)
    return SimpleNamespace(**values)


def module(version: str = "25.11.2", jobs=(), nodes=()):
    return SimpleNamespace(
        __version__=version,
        Jobs=SimpleNamespace(load=lambda: {str(j.id): j for j in jobs}),
        Nodes=SimpleNamespace(load=lambda: {n.name: n for n in nodes}),
    )


def backend(mod) -> pb.PyslurmSlurm:
    return pb.PyslurmSlurm(module=mod)


# ------------------------------------------------------------------------------------ choosing


def test_cli_keeps_the_commands_without_importing_pyslurm():
    cli = Cli()
    assert pb.choose("cli", cli, importer=lambda: pytest.fail("imported")) is cli


@pytest.mark.parametrize("setting", ["auto", "pyslurm"])
def test_auto_and_pyslurm_take_pyslurm_when_it_is_for_the_running_release(setting):
    assert isinstance(pb.choose(setting, Cli("25.11.7"), importer=lambda: module("25.11.2")), pb.PyslurmSlurm)


def test_auto_without_pyslurm_is_the_commands_and_asks_slurm_nothing(caplog):
    def missing():
        raise ModuleNotFoundError("No module named 'pyslurm'")

    cli = Cli("")  # config() would raise: it is never asked
    caplog.set_level(logging.INFO)
    assert pb.choose("auto", cli, importer=missing) is cli
    assert "backend = auto, but pyslurm does not import" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_pyslurm_of_the_running_release_is_chosen_and_logged(caplog):
    caplog.set_level(logging.INFO)
    chosen = pb.choose("pyslurm", Cli("25.11.7"), importer=lambda: module("25.11.2"))
    assert isinstance(chosen, pb.PyslurmSlurm)
    assert "through pyslurm 25.11.2 (Slurm 25.11.7)" in caplog.text


@pytest.mark.parametrize(
    ("running", "importer", "said"),
    [
        ("24.11.5", lambda: module("25.11.2"), "pyslurm 25.11.2 is not for the running Slurm 24.11.5"),
        ("26.05.1", lambda: module("25.11.2"), "is not for the running Slurm 26.05.1"),
        ("25.11.7", lambda: module("garbage"), "is not for the running Slurm 25.11.7"),
        ("", lambda: module(), "the controller's version is unknown"),
    ],
)
def test_another_release_keeps_the_commands_and_says_why_once(caplog, running, importer, said):
    cli = Cli(running)
    assert pb.choose("pyslurm", cli, importer=importer) is cli
    assert said in caplog.text and caplog.text.count("reading Slurm through its commands") == 1


def test_a_pyslurm_that_does_not_load_keeps_the_commands(caplog):
    def broken():
        raise ImportError("libslurmfull.so: version `GLIBC_2.38' not found")

    cli = Cli()
    assert pb.choose("pyslurm", cli, importer=broken) is cli
    assert "GLIBC_2.38" in caplog.text


# ------------------------------------------------------------------------------------ records


def test_a_job_gives_the_cli_record():
    job = backend(module(jobs=[fake_job(7)])).jobs()[0]
    assert job == Job(job_id="7", state="RUNNING", nodes=("pre1", "pre2"), user="alice", name="train",
                      partition="batch", num_nodes=2, start_time=job.start_time, submit_time=job.submit_time,
                      eligible_time=job.eligible_time, features="preemptible",
                      comment="slurm-preempt:signal=USR1")  # fmt: skip
    assert job.start_time is not None and int(job.start_time.timestamp()) == 1_800_000_000


def test_an_array_task_has_its_arrays_id():
    job = backend(module(jobs=[fake_job(12, array_id=10, array_task_id=2)])).jobs()[0]
    assert (job.job_id, job.display_id) == ("12", "10_2")


def test_user_text_is_cut_at_the_cli_widths_and_never_structure():
    name = "é" * 40 + "\n|\x1f"  # 80 bytes of two-byte characters, then what the CLI frames on
    job = backend(module(jobs=[fake_job(7, name=name, comment="x" * 600)])).jobs()[0]
    assert job.name == "é" * 32 and len(job.comment) == 512
    job = backend(module(jobs=[fake_job(8, name="a|b\nc\x1fd")])).jobs()[0]
    assert job.name == "a|b\nc\x1fd" and job.job_id == "8"
    assert pb.fit("aé", 2) == "a\ufffd"  # a character cut in two, as the CLI's field holds it


def test_a_record_that_is_not_slurms_is_refused_alone(caplog):
    jobs = [fake_job(7, allocated_nodes="pre[1-"), fake_job(8)]
    assert [j.job_id for j in backend(module(jobs=jobs)).jobs()] == ["8"]
    assert "pyslurm job refused" in caplog.text


def test_an_undecodable_job_is_read_again_through_the_cli(monkeypatch):
    bad = type("BadJob", (SimpleNamespace,), {"name": Undecodable()})(**{
        k: v for k, v in vars(fake_job(9)).items() if k != "name"})  # fmt: skip
    cli = Cli()
    slurm = backend(module(jobs=[fake_job(7), bad]))
    monkeypatch.setattr(Slurm, "jobs", lambda self, **q: Cli.jobs(cli, **q))
    found = slurm.jobs(nodes=["pre1"], states="running")
    assert [j.job_id for j in found] == ["7", "9"] and found[1].name == "m\ufffd"
    assert cli.asked == [("jobs", {"job_ids": ["9"], "states": "running"})]


def test_an_undecodable_node_reason_is_read_again_through_the_cli(monkeypatch):
    bad = type("BadNode", (SimpleNamespace,), {"reason": Undecodable()})(**{
        k: v for k, v in vars(fake_node("pre2")).items() if k != "reason"})  # fmt: skip
    cli = Cli()
    monkeypatch.setattr(Slurm, "nodes", lambda self, **q: Cli.nodes(cli, **q))
    found = backend(module(nodes=[fake_node("pre1"), bad])).nodes(states="drain")
    assert [(n.name, n.reason) for n in found] == [("pre1", "TogetherPreemptionNotified"), ("pre2", "\ufffd")]


def test_a_failed_load_is_a_slurm_error_the_poll_retries():
    def refused():
        raise RuntimeError("Unable to contact slurm controller")

    slurm = pb.PyslurmSlurm(module=SimpleNamespace(Jobs=SimpleNamespace(load=refused)))
    with pytest.raises(SlurmError, match="Unable to contact"):
        slurm.jobs()


# ------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize(
    ("state", "states", "matches"),
    [
        ("MIXED+DRAIN", "drain,down", True),
        ("IDLE+DRAIN", "drain", True),
        ("DOWN*", "drain,down", True),
        ("MIXED", "drain,down", False),
        ("IDLE+NOT_RESPONDING", "idle", True),
        ("ALLOCATED", None, True),
    ],
)
def test_node_states_as_sinfo_filters_them(state, states, matches):
    assert [n.name for n in backend(module(nodes=[fake_node("pre1", state)])).nodes(states=states)] == (
        ["pre1"] if matches else []
    )


@pytest.mark.parametrize(
    ("state", "states", "matches"),
    [
        ("RUNNING", "running,configuring", True),
        ("CONFIGURING", "running", True),  # a flag over RUNNING: squeue -t running lists it
        ("REQUEUE_HOLD", "pending,requeue_hold", True),
        ("REQUEUE_HOLD", "pending", True),
        ("COMPLETING", "running,configuring", False),
        ("COMPLETED", None, False),  # squeue leaves ended jobs out unless asked for them
        ("COMPLETED", "all", True),
        ("PENDING", "running", False),
    ],
)
def test_job_states_as_squeue_filters_them(state, states, matches):
    found = backend(module(jobs=[fake_job(7, state=state)])).jobs(states=states)
    assert [j.job_id for j in found] == (["7"] if matches else [])


def test_jobs_by_id_node_and_user():
    jobs = [fake_job(7), fake_job(8, allocated_nodes="std1", user_name="bob"),
            fake_job(12, array_id=10, array_task_id=2, state="COMPLETED")]  # fmt: skip
    slurm = backend(module(jobs=jobs))
    assert [j.job_id for j in slurm.jobs(nodes=["pre2"])] == ["7"]
    assert [j.job_id for j in slurm.jobs(user="bob")] == ["8"]
    assert [j.job_id for j in slurm.jobs(job_ids=["10_2"])] == ["12"]  # given ids: ended ones too
    assert [j.nodes for j in slurm.nodes(names=["x"])] == []


def test_idle_nodes_of_one_partition_as_sinfo_p_gives_them():
    """Grow-back's `sinfo -N -t idle --partition=P` (watch/growback.py): pyslurm's Node.partitions."""
    nodes = [fake_node("pre1", "IDLE", partitions=["batch"]), fake_node("pre2", "IDLE", partitions=["other"]),
             fake_node("pre3", "MIXED", partitions=["batch"])]  # fmt: skip
    slurm = backend(module(nodes=nodes))
    assert [n.name for n in slurm.nodes(states="idle", partition="batch")] == ["pre1"]
    assert [n.name for n in slurm.nodes(states="idle")] == ["pre1", "pre2"]
