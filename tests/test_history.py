"""history.build on event lists shaped as the hooks, the watcher and the job write them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from slurm_preempt.records import attempts, history, texts
from slurm_preempt.slurm.sacct import AcctRecord

T0 = datetime(2026, 12, 1, 6, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def ev(kind: str, offset: float, **fields) -> dict:
    order = int((T0 + timedelta(seconds=offset)).timestamp() * 1e9)
    return {"kind": kind, "job_id": "5", "time": at(offset), "_order": order, **fields}


def start(seconds, restart, node):
    return ev(
        "attempt_start",
        seconds,
        hook="prolog",
        restart_count=restart,
        node=node,
        nodes=node,
        user="alice",
        partition="batch",
        constraints="preemptible",
        cpus_per_node="4",
        gpus="0,1",
    )


def end(seconds, restart, hook="epilog_slurmctld", code="0:0", node=""):
    return ev("attempt_end", seconds, hook=hook, restart_count=restart, exit_code=code, node=node)


def three_attempts() -> list[dict]:
    return [
        start(0, 0, "pre1"),
        ev("checkpoint_saved", 40, seconds=2.0),
        ev("notice_sent", 50, event_id=f"pre1@{at(45)}", deadline=at(345)),
        end(100, 0),
        end(200, 0, hook="epilog", node="pre1"),  # late: pre1's slurmd came back after attempt 1 began
        start(130, 1, "pre2"),
        ev("checkpoint_saved", 150, seconds=4.0),
        end(160, 1),
        start(300, 2, "pre3"),
        end(400, 2, hook="epilog", node="pre3"),
        end(400.5, 2),
    ]


def test_ledger_alone_tells_causes_losses_and_waits():
    found = history.build("5", three_attempts())
    a0, a1, a2 = found.attempts
    assert [a.number for a in found.attempts] == [0, 1, 2]
    assert [a.cause for a in found.attempts] == ["node failure (preempted)"] * 2 + [
        "completed, cancelled or timed out"
    ]
    assert [a.nodes for a in found.attempts] == [["pre1"], ["pre2"], ["pre3"]]
    assert a0.lost_seconds == 60 and a1.lost_seconds == 10 and a2.lost_seconds == 0
    assert a0.notice_time == T0 + timedelta(seconds=45) and a0.deadline == T0 + timedelta(seconds=345)
    assert (a1.wait_before, a2.wait_before) == (30, 140)
    assert a0.gpus == 2 and a0.cpus == 4
    assert found.user == "alice" and found.checkpoint_seconds == [2.0, 4.0]


def test_exit_codes_without_accounting():
    failed = history.build("5", [start(0, 0, "n1"), end(5, 0, code="3:0", hook="epilog", node="n1")])
    assert failed.attempts[0].cause == "failed (exit 3)"
    killed = history.build("5", [start(0, 0, "n1"), end(5, 0, code="0:15")])
    assert killed.attempts[0].cause == "killed by signal 15"
    running = history.build("5", [start(0, 0, "n1")])
    assert running.attempts[0].cause == "running" and running.attempts[0].lost_seconds == 0


def test_requeue_with_node_alive_after_notice_is_a_preemption():
    events = [
        start(0, 0, "pre1"),
        ev("notice_sent", 10, event_id=f"pre1@{at(10)}", deadline=at(40)),
        ev("checkpoint_saved", 20),
        ev("requeued", 21),
        end(25, 0, hook="epilog", node="pre1"),
        end(25, 0),
        start(30, 1, "pre2"),
        end(50, 1),
    ]
    found = history.build("5", events)
    assert found.attempts[0].cause == "requeued after notice" and found.attempts[0].preempted
    assert found.attempts[0].lost_seconds == 5


def row(state, start_s, end_s, nodes, code="0:0"):
    return AcctRecord(
        job_id="5",
        display_id="5",
        state=state,
        exit_code=code,
        submit=T0,
        start=T0 + timedelta(seconds=start_s),
        end=T0 + timedelta(seconds=end_s),
        num_nodes=1,
        nodes=(nodes,),
        partition="batch",
        user="alice",
        alloc_tres={"cpu": "4", "gres/gpu": "2"},
    )


def test_sacct_states_win_and_fill_gaps():
    rows = [
        row("NODE_FAIL", 0, 101, "pre1"),
        row("NODE_FAIL", 131, 160, "pre2"),
        row("CANCELLED", 300, 400, "pre3", "0:15"),
    ]
    events = [e for e in three_attempts() if not (e["kind"] == "attempt_start" and e["restart_count"] == 1)]
    found = history.build("5", events, rows)
    assert found.accounting
    assert [a.cause for a in found.attempts] == ["node failure (preempted)"] * 2 + ["cancelled"]
    assert [a.source for a in found.attempts] == ["ledger+sacct"] * 3
    assert found.attempts[1].nodes == ["pre2"] and found.attempts[1].checkpoints  # job event placed by time
    assert found.submit == T0


def test_text_and_json_render():
    found = history.build("5", three_attempts())
    text = texts.history_text(found)
    assert "attempt 1  pre2" in text and "ended: node failure (preempted)" in text
    assert found.to_json()["attempts"][0]["lost_seconds"] == 60.0


def test_self_requeue_ends_counted_for_the_attempt_that_ended(data_dir):
    """A real ledger (the demo: three notices, each followed by `scontrol requeue` from the job).

    Slurm raises the restart count before the epilogs of a requeued attempt run, so each end arrives
    with the next attempt's number: history must still pair every end with its own start.
    """
    found = history.from_ledger("28056304", data_dir / "ledger-self-requeue")
    assert [a.number for a in found.attempts] == [0, 1, 2, 3]
    assert [a.nodes for a in found.attempts] == [["pre1"], ["pre2"], ["pre1"], ["pre2"]]
    for attempt in found.attempts:
        assert attempt.start < attempt.end
    assert all(a.lost_seconds < 1 for a in found.attempts)  # final checkpoint just before each end


def test_work_after_a_final_checkpoint_is_not_lost():
    """The job saved its final checkpoint because it was leaving: what follows is leaving, not work."""
    events = [
        start(0, 0, "pre1"),
        ev("notice_sent", 10, event_id=f"pre1@{at(10)}", deadline=at(40)),
        ev("checkpoint_saved", 20, final=True),
        ev("requeued", 21),
        end(25, 0, hook="epilog", node="pre1"),
        end(25, 0),
        start(30, 1, "pre2"),
        ev("checkpoint_saved", 35),
        end(50, 1),  # no node epilog before the next start: pre2 vanished, the work since 35 is lost
        start(60, 2, "pre3"),
        end(70, 2),
    ]
    found = history.build("5", events)
    assert found.attempts[1].cause == "node failure (preempted)"
    assert [a.lost_seconds for a in found.attempts] == [0, 15, 0]
    assert found.lost_seconds == 15 and found.to_json()["lost_seconds"] == 15


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.04, "0s"), (0.2, "0.2s"), (9.94, "9.9s"), (10.4, "10s"), (125, "2m05s"), (7500, "2h05m")],
)
def test_one_rounding_of_durations(seconds, text):
    assert attempts.seconds_text(seconds) == text


def test_work_lost_is_one_figure_in_history_timeline_and_report(data_dir):
    """README's demo job (three notices, each followed by a final checkpoint and a self-requeue): the
    history, the timeline's title and the report tell the same work lost."""
    from slurm_preempt.records import report, timeline

    found = history.from_ledger("28056304", data_dir / "ledger-self-requeue")
    figure = attempts.seconds_text(found.lost_seconds)
    assert figure == "0s"  # every preempted attempt left right after its final checkpoint
    text = texts.history_text(found)
    assert f"3 preemption(s), {figure} of work lost" in text
    for attempt in found.attempts:
        assert f"work lost {attempts.seconds_text(attempt.lost_seconds)}" in text
    title = ET.fromstring(timeline.render_svg(found)).find("{http://www.w3.org/2000/svg}text")
    assert title is not None and f"3 preemption(s), {figure} of work lost" in (title.text or "")
    cost = report.job_cost(found, report.Prices())
    assert cost.lost_hours == found.lost_seconds / 3600  # one CPU: resource-hours are hours


def controller_end(seconds, restart):
    """EpilogSlurmctld's record as the hook writes it, with the attempt's node list."""
    return ev(
        "attempt_end", seconds, hook="epilog_slurmctld", restart_count=restart, exit_code="0:0", nodes="pre1"
    )


def test_an_attempt_whose_prolog_never_ran_keeps_its_own_end():
    """Seen on 22.05 with a node that came back at once (bench_e2e): the job relaunched on it ran
    without a prolog (slurmd, restarted on its spool, still knew the job id), so attempt 1 has no
    start. A node failure does not raise the restart count before EpilogSlurmctld, so the end saying 1
    is attempt 1's: attempt 0 already has its controller end."""
    events = [
        start(0, 0, "pre1"),
        ev("checkpoint_saved", 12),
        controller_end(14.4, 0),  # pre1 removed: NODE_FAIL, EpilogSlurmctld with restart count 0
        end(16.4, 0, hook="epilog", node="pre1"),  # pre1 back: the late node epilog
        ev("checkpoint_saved", 23),
        controller_end(24.4, 1),  # pre1 removed again, attempt 1 (no prolog ran) ends
        end(26.4, 1, hook="epilog", node="pre1"),
        start(27.6, 2, "pre2"),
        end(40, 2),
    ]
    rows = [
        row("NODE_FAIL", 0, 14, "pre1"),
        row("NODE_FAIL", 17, 24, "pre1"),
        row("COMPLETED", 27, 40, "pre2"),
    ]
    for acct in (None, rows):
        found = history.build("5", events, acct)
        first = found.attempts[0]
        assert first.end == T0 + timedelta(seconds=14.4), acct
        assert round(first.lost_seconds, 1) == 2.4
    with_acct = history.build("5", events, rows).attempts[1]
    assert with_acct.start == T0 + timedelta(seconds=17) and with_acct.end == T0 + timedelta(seconds=24.4)
    assert round(with_acct.lost_seconds, 1) == 1.4


class _Slurm:
    """Answers the two questions history asks about an array task: squeue (``job``), sacct."""

    def __init__(self, job=None, rows=()):
        self.answer, self.rows = job, list(rows)

    def job(self, _job_id):
        return self.answer

    def accounting(self, _ids):
        return self.rows


def test_history_of_an_array_task_named_a_t(tmp_path):
    """The hooks and the watcher file a task's ledger under its own job id; `history A_T` finds it."""
    from slurm_preempt import ledger
    from slurm_preempt.errors import UsageError
    from slurm_preempt.slurm.parse import Job

    ledger.record(tmp_path, "41", "attempt_start", source="hook", hook="prolog", restart_count=0, node="pre1")
    ledger.record(tmp_path, "41", "attempt_end", source="hook", hook="epilog_slurmctld", restart_count=0)
    running = _Slurm(job=Job("41", "RUNNING", array_job_id="40", array_task_id="2"))
    found = history.run_history("40_2", tmp_path, use_sacct=False, slurm=running)
    assert found.job_id == "41" and len(found.attempts) == 1
    ended = _Slurm(rows=[AcctRecord(job_id="41", display_id="40_2", state="COMPLETED")])
    assert history.run_history("40_2", tmp_path, slurm=ended).job_id == "41"
    with pytest.raises(UsageError, match="cannot tell which job array task 40_2 is"):
        history.run_history("40_2", tmp_path, slurm=_Slurm())


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to make files of another owner")
def test_history_says_who_wrote_each_event(tmp_path):
    """Issue 28: a notice recorded by the job's owner (their sidecar, or their own say-so) is shown as
    theirs, not as the cluster watcher's; the counts by writer are in the text and the JSON."""
    import json
    import os

    from hostileusers import MALLORY, ensure_user
    from slurm_preempt import ledger

    mallory, _ = ensure_user(MALLORY)
    job = "31"
    ledger.record(tmp_path, job, "attempt_start", source="hook", restart_count=0, nodes="pre1")
    folder = ledger.job_dir(tmp_path, job)
    os.chown(folder, mallory, mallory)
    claimed = ledger.record(
        tmp_path, job, "notice_sent", source="watcher", event_id="pre1@2026-01-01T00:00:00Z"
    )
    os.chown(claimed, mallory, mallory)
    found = history.from_ledger(job, tmp_path)
    assert found.events_by == {"root": 1, "owner": 1}
    assert found.attempts[0].notice_by == "owner"
    text = texts.history_text(found)
    assert "(from the job's owner)" in text and "events written by: job's owner 1, root 1" in text
    assert json.loads(json.dumps(found.to_json()))["attempts"][0]["notice_by"] == "owner"


def shrunk_in_place() -> list[dict]:
    """A 3-node attempt that gave pre3 back at T+52 s and ran again on two at T+60 s (job/shrink.py)."""
    return [
        start(0, 0, "pre[1-3]"),
        ev("notice_sent", 50, event_id=f"pre3@{at(49)}", deadline=at(349)),
        ev("checkpoint_saved", 50.5, seconds=0.3, final=True),
        ev(
            "shrunk",
            52,
            nodes_before="pre[1-3]",
            nodes_after="pre[1-2]",
            noticed_at=at(50),
            checkpoint_at=at(50.5),
            shrunk_at=at(52),
            step=40,
        ),  # fmt: skip
        ev("resumed_from", 60, step=40, nodes=2, previous_nodes=3),
        end(200, 0),
    ]


def test_a_shrink_is_an_event_inside_its_attempt_with_its_cost():
    found = history.build("5", shrunk_in_place())
    (attempt,) = found.attempts
    (shrink,) = attempt.shrinks
    assert (shrink.nodes_before, shrink.nodes_after) == ("pre[1-3]", "pre[1-2]")
    assert shrink.running_again_at == T0 + timedelta(seconds=60) and shrink.cost_seconds == 9.5
    assert found.shrink_seconds == 9.5 and attempt.lost_seconds == 0 and not attempt.preempted
    text = texts.history_text(found)
    assert "1 attempt(s), 0 preemption(s)" in text and "shrank pre[1-3] -> pre[1-2]" in text
    assert "idle 9.5s, no requeue" in text
    assert found.to_json()["attempts"][0]["shrinks"][0]["cost_seconds"] == 9.5


def test_sacct_resizing_rows_are_one_attempt():
    """A shrink closes the job's sacct row as RESIZING and opens another: one attempt, not two."""
    rows = [row("RESIZING", 0, 52, "pre[1-3]"), row("COMPLETED", 52, 200, "pre[1-2]")]
    found = history.build("5", shrunk_in_place(), rows)
    (attempt,) = found.attempts
    assert attempt.cause == "completed" and attempt.start == T0 and len(attempt.shrinks) == 1
    alone = history.build("5", [], rows)  # sacct only
    assert [a.cause for a in alone.attempts] == ["completed"] and alone.attempts[0].nodes == ["pre[1-3]"]
