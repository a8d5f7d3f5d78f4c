"""slurm_preempt.watch.storm and the watcher's fallback-storm: N attempts in a row without a newer
checkpoint move the job once, with the reason in its ledger (fake Slurm, injected clock)."""

from __future__ import annotations

from datetime import timedelta

from fakeslurm import T0
from slurm_preempt import ledger, optin
from slurm_preempt.notice import to_text
from slurm_preempt.records import history, texts
from slurm_preempt.watch.storm import storm
from watchworld import OPTED

MINUTE = timedelta(minutes=1)


def ev(kind: str, minutes: float, **fields) -> dict:
    return {"kind": kind, "time": to_text(T0 + minutes * MINUTE), **fields}


def attempts(saves_per_attempt: list[list[int]]) -> list[dict]:
    """Attempt r starts at minute 10 r and saves the steps given, a minute apart."""
    events = []
    for count, steps in enumerate(saves_per_attempt):
        events.append(ev("attempt_start", 10 * count, restart_count=count))
        events += [ev("checkpoint_saved", 10 * count + 1 + i, step=s) for i, s in enumerate(steps)]
    return events


def test_a_storm_is_n_attempts_without_a_newer_checkpoint():
    now = T0 + 60 * MINUTE
    stuck = attempts([[100, 200], [200], [], [150]])  # attempts 1-3 never beat step 200
    assert "3 attempts in a row saved no newer checkpoint" in storm(stuck, 4, 3, now)
    assert "newest: step 200" in storm(stuck, 4, 3, now)
    moving = attempts([[100], [], [], [300]])
    assert storm(moving, 4, 3, now) is None
    assert storm(stuck, 2, 3, now) is None  # fewer attempts than N
    never = attempts([[], [], []])
    assert "newest: none" in storm(never, 3, 3, now)
    forged = attempts([[100], [], []]) + [
        ev("checkpoint_saved", 25, step="9999"),
        ev("checkpoint_saved", 99, step=900),
    ]
    assert storm(forged, 3, 2, now) is not None  # a step not a number, or in the future, never counts
    assert storm(attempts([[100], [], []])[1:], 3, 3, now) is None  # window's first start unrecorded


def test_the_token_round_trips():
    wish = optin.parse("slurm-preempt:signal=USR1 slurm-preempt:fallback-storm=3")
    assert wish.fallback_storm == 3 and optin.parse(wish.to_comment()) == wish
    assert optin.parse("slurm-preempt:fallback-storm=-1").fallback_storm is None


def test_watcher_moves_a_storming_job_once_and_history_says_why(world):
    comment = f"{OPTED} slurm-preempt:fallback-storm=2"
    world.slurm.add_job("8", comment=comment, restart_count=3, reason="BeginTime", features="preemptible")
    for event in attempts([[100], [100], [], []]):
        kind, time = event.pop("kind"), event.pop("time")
        ledger.record(
            world.state_dir, "8", kind, "prolog" if kind == "attempt_start" else "job", time=time, **event
        )
    world.clock.advance(3600)
    watcher = world.watcher()
    watcher.poll_once()
    watcher.poll_once()
    moved = [c for c in world.slurm.called("update_job") if "features" in c]
    assert moved == [{"job_id": "8", "features": "standard"}]
    [record] = [e for e in ledger.events(world.state_dir, "8") if e["kind"] == "fallback"]
    assert record["why"].startswith("restart storm: 2 attempts")
    text = texts.history_text(history.from_ledger("8", world.state_dir, None))
    assert "moved to standard: restart storm: 2 attempts in a row" in text
