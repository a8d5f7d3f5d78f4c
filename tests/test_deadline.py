"""slurm_preempt.watch.deadline and the watcher's fallback-deadline: a job that can no longer finish in
time on preemptible nodes is moved once, before its scontrol call is made a ledger record; a job with a
loose deadline never is; the job's own figures are checked (fake Slurm, injected clock)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fakeslurm import T0
from slurm_preempt import ledger, optin
from slurm_preempt.notice import to_text
from slurm_preempt.watch import deadline
from watchworld import OPTED

HOUR = timedelta(hours=1)


def ev(kind: str, at, **fields) -> dict:
    return {"kind": kind, "time": to_text(at), **fields}


def progress_events(done: int, total: int, hours: float) -> list[dict]:
    return [ev("attempt_start", T0), ev("checkpoint_saved", T0 + hours * HOUR, step=done, total_steps=total)]


def test_progress_is_the_newest_checked_save_since_the_first_start():
    events = [
        ev("attempt_start", T0 + HOUR),
        ev("attempt_start", T0),
        ev("checkpoint_saved", T0 + 2 * HOUR, step=200, total_steps=1000),
        ev("checkpoint_saved", T0 + 3 * HOUR, step=True, total_steps=1000),  # not a number
        ev("checkpoint_saved", T0 + 3 * HOUR, step=5000, total_steps=1000),  # beyond the total
        ev("checkpoint_saved", T0 + 3 * HOUR, step=float("nan"), total_steps=1000),
        ev("checkpoint_saved", T0 + 30 * HOUR, step=900, total_steps=1000),  # in the future
        {"kind": "checkpoint_saved", "time": "yesterday", "step": 900, "total_steps": 1000},
        ev("progress", T0 + 2.5 * HOUR, step=250, total_steps=1000),
    ]
    found = deadline.progress_of(events, T0 + 4 * HOUR)
    assert found == deadline.Progress(T0, T0 + 2.5 * HOUR, 250.0, 1000.0)
    assert deadline.progress_of(events[2:], T0 + 4 * HOUR) is None  # no start: nothing to judge


@pytest.mark.parametrize(
    ("deadline_hours", "moved"),
    [(50, False), (11, False), (9, True), (3.9, True)],
)
def test_behind_when_the_steps_left_at_the_measured_rate_no_longer_fit(deadline_hours, moved):
    # 100 of 1000 steps in the first hour: 9 more hours at that rate (9.45 with the 5% margin).
    progress = deadline.Progress(T0, T0 + HOUR, 100, 1000)
    why = deadline.behind(progress, T0 + deadline_hours * HOUR, T0 + HOUR)
    assert (why is not None) == moved
    if moved and deadline_hours > 1:
        assert "needs 9.45 h" in why


def test_too_early_to_judge_only_a_missed_deadline_moves():
    early = deadline.Progress(T0, T0 + 0.5 * HOUR, 1, 1000)  # 5% of the time to the deadline
    assert deadline.behind(early, T0 + 10 * HOUR, T0 + HOUR) is None
    assert "passed" in deadline.behind(None, T0 + 10 * HOUR, T0 + 11 * HOUR)


def test_the_token_reads_a_utc_time_and_refuses_anything_else():
    wish = optin.parse("slurm-preempt:signal=USR1 slurm-preempt:fallback-deadline=2026-12-01T20:00:00Z")
    assert wish.fallback_deadline == T0 + 14 * HOUR
    assert optin.parse(wish.to_comment()) == wish
    for bad in ("tomorrow", "2026-13-01T20:00:00Z", "2026-12-01T20:00:00Z;rm", "9" * 40):
        assert optin.parse(f"slurm-preempt:fallback-deadline={bad}").fallback_deadline is None


def _requeued(world, deadline_at, done, hours):
    comment = f"{OPTED} slurm-preempt:fallback-deadline={optin.deadline_text(deadline_at)}"
    job = world.slurm.add_job(
        "7", comment=comment, restart_count=2, reason="BeginTime", features="preemptible"
    )
    for event in progress_events(done, 1000, hours):
        kind, time = event.pop("kind"), event.pop("time")
        ledger.record(
            world.state_dir, "7", kind, "prolog" if kind == "attempt_start" else "job", time=time, **event
        )
    world.clock.advance(hours * 3600 + 300)
    return job


def test_watcher_moves_a_job_that_cannot_make_its_deadline_once_recorded_before(world):
    _requeued(world, T0 + 6 * HOUR, done=100, hours=1)  # needs ~9 h more, 5 h left
    watcher = world.watcher()
    watcher.poll_once()
    assert {"job_id": "7", "features": "standard"} in world.slurm.called("update_job")
    moves = [e for e in ledger.events(world.state_dir, "7") if e["kind"] == "fallback"]
    assert len(moves) == 1 and "fallback-deadline 2026-12-01 12:00:00Z" in moves[0]["why"]
    world.slurm.job("7").features = "preemptible"  # whatever it shows later: moved once, stays moved
    watcher.poll_once()
    assert [c for c in world.slurm.called("update_job") if "features" in c] == [
        {"job_id": "7", "features": "standard"}
    ]


def test_watcher_never_moves_a_job_with_a_loose_deadline(world):
    _requeued(world, T0 + 30 * HOUR, done=100, hours=1)
    world.watcher().poll_once()
    assert not [e for e in ledger.events(world.state_dir, "7") if e["kind"] == "fallback"]
    assert not [c for c in world.slurm.called("update_job") if "features" in c]


def test_progress_from_bash_and_from_run_reaches_the_rule(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from slurm_preempt.cli import main
    from slurm_preempt.job.resume import Run, Wiring
    from slurm_preempt.notice import utcnow

    state = tmp_path / "state"
    (tmp_path / "config.toml").write_text("")
    env = {"SLURM_JOB_ID": "9", "SLURM_PREEMPT_STATE_DIR": str(state)}
    env["SLURM_PREEMPT_CONFIG"] = str(tmp_path / "config.toml")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    said = CliRunner().invoke(main, ["resume", "progress", "120", "1000"])
    assert said.exit_code == 0, said.output
    bad = CliRunner().invoke(main, ["resume", "progress", "1200", "1000"])
    assert bad.exit_code == 2 and bad.output.startswith("Error: progress 1200 of 1000")
    with Run(
        tmp_path / "ckpt", every=1, total_steps=1000, _wiring=Wiring(environ=env, log_to_stderr=True)
    ) as run:
        run.save(300, {"w": 1})
    ledger.record(state, "9", "attempt_start", "prolog", time=to_text(utcnow() - 2 * HOUR))
    found = deadline.progress_of(ledger.trusted_events(state, "9"), utcnow() + HOUR)
    assert found is not None and (found.done, found.total) == (300.0, 1000.0)
