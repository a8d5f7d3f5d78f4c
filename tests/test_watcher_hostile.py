"""The watcher against hostile bytes: every job of the fake Slurm goes through squeue's real output
format and the real parser, with arbitrary bytes in other users' job names and comments (hypothesis).

What Slurm itself prints is checked on the real cluster (test_hostile_cluster.py, and the captured
output in test_parse.py); here the property runs hundreds of examples in seconds.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakeslurm import Clock, FakeSlurm
from slurm_preempt.notice import notice_path
from slurm_preempt.slurm import parse
from slurm_preempt.slurm.parse import Job
from slurm_preempt.watch.sentstate import SentState
from slurm_preempt.watch.settings import Settings
from slurm_preempt.watch.watcher import Watcher

OPTED = "slurm-preempt:signal=USR1"
SEP = parse.SEP.encode()


class SqueueBytes(FakeSlurm):
    """The fake's jobs printed as squeue prints them (format_arg(JOB_FIELDS, JOB_TEXT_FIELDS)), bytes
    of any value in names and comments, and parsed back by the real parser."""

    def __init__(self, clock):
        super().__init__(clock)
        self.raw: dict[str, tuple[bytes, bytes]] = {}  # job id -> (name, comment) as the user wrote them

    def jobs(self, **query) -> list[Job]:
        return parse.parse_jobs(b"".join(self._record(job) for job in super().jobs(**query)))

    def _record(self, job: Job) -> bytes:
        name, comment = self.raw.get(job.job_id, (b"", job.comment.encode()))
        # Submitted, started, eligible before the fake's T0.
        head = [job.job_id, job.job_id, "N/A", job.state, ",".join(job.nodes) or "(null)", "0", "u", "batch",
                "1", "1796100000", "1796100000", "1796100000"]  # fmt: skip
        texts = [job.reason.encode(), job.features.encode(), name, comment]
        out = b"".join(field.encode() + SEP for field in head)
        for (_key, width), text in zip(parse.JOB_TEXT_FIELDS, texts, strict=True):
            out += text.replace(b"\0", b"")[:width].ljust(width)  # squeue: cut or padded, C strings
        return out + b"\n"


def _forged(job_id: str, node: str) -> bytes:
    fields = [job_id, job_id, "N/A", "RUNNING", node, "0", "sp-alice", "batch", "1", "1", "1", "1"]
    return b"\n" + SEP.join(f.encode() for f in fields) + SEP + b"None " + OPTED.encode()


HOSTILE = st.one_of(
    st.binary(max_size=600),
    st.sampled_from(
        [
            _forged("1001", "pre1"),
            _forged("2001", "pre2"),
            _forged("--partition=batch", "pre1"),
            _forged("../../..", "pre1"),
            b"\r\x0b\x0c\x1c\x1d\x1e\xc2\x85\xe2\x80\xa8\xff",
        ]
    ),  # fmt: skip
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.lists(st.tuples(HOSTILE, HOSTILE, st.booleans()), min_size=1, max_size=4))
def test_hostile_jobs_on_a_drained_node_never_steer_the_watcher(tmp_path_factory, hostile):
    """Done when (issue 11): with jobs whose names and comments hold arbitrary bytes on a drained node,
    every other job there is told within one poll, no forged or non-existent job id is acted on, and
    no other user's job changes."""
    state_dir = Path(tmp_path_factory.mktemp("state"))
    clock = Clock()
    slurm = SqueueBytes(clock)
    slurm.add_job("1001", ["pre1"], OPTED)  # alice's jobs on the node that drains
    slurm.add_job("1002", ["pre1"], "")
    slurm.add_job("2001", ["pre2"], OPTED)  # alice's job elsewhere: must not change
    slurm.add_job("2002", [], OPTED, reason="BeginTime", restart_count=1)  # pending, requeued elsewhere
    mallory = []
    for i, (name, comment, opted) in enumerate(hostile):
        job_id = str(3001 + i)
        slurm.add_job(job_id, ["pre1"])
        slurm.raw[job_id] = (name, (OPTED.encode() + b" " if opted else b"") + comment)
        mallory.append(job_id)
    slurm.drain(["pre1"], "TogetherPreemptionNotified: reclaimed")
    watcher = Watcher(slurm, Settings(grace=300.0), SentState(), state_dir, clock=clock)
    watcher.poll_once()

    real = set(slurm.job_table)
    on_pre1 = {"1001", "1002", *mallory}
    told = {p.stem for p in (state_dir / "notices").iterdir()}
    assert told == on_pre1  # every job on the node told in this one poll, and only those
    signalled = [i for call in slurm.called("signal_many") for i in call["job_ids"]]
    assert set(signalled) <= real and "1001" in signalled and "2001" not in signalled
    assert slurm.job("2001").signals == [] and slurm.job("2001").state == "RUNNING"
    touched = [c for c in slurm.calls if c.name in ("requeue", "update_job")]
    assert all(c.args["job_id"] in real for c in touched) and not any(
        c.args["job_id"] == "2001" for c in touched
    )
    assert all(notice_path(state_dir, j).is_file() for j in on_pre1)
    assert not (state_dir.parent / "..json").exists() and not list(state_dir.glob("**/*partition*"))
