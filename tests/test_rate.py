"""slurm_preempt.watch.rate: the live preemption rate per pool, its jump window, what never moves it,
the published file, and the watcher publishing it (fake Slurm, injected clock)."""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from fakeslurm import T0, FakeSlurm
from slurm_preempt.watch import rate
from slurm_preempt.watch.rate import RateTracker
from watchworld import REASON

HOUR = 3600.0


def steady(tracker: RateTracker, nodes: int, per_node_hour: float, hours: float, pool="preemptible"):
    """Preemptions spread evenly over ``hours`` before T0 + hours, at ``per_node_hour`` each node."""
    count = round(per_node_hour * nodes * hours)
    for i in range(count):
        when = T0 + timedelta(seconds=(i + 0.5) * hours * HOUR / count)
        assert tracker.saw(f"pre{i % nodes + 1}", pool, when, T0 + timedelta(hours=hours))
    return T0 + timedelta(hours=hours)


def test_a_steady_field_gives_its_rate_over_the_long_window():
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({"preemptible": 20, "standard": 4})
    now = steady(tracker, 20, 0.5, 6)
    found = {r.pool: r for r in tracker.estimate(now)}
    assert found["preemptible"].per_node_hour == pytest.approx(0.5)
    assert found["preemptible"].preemptions == 60 and not found["preemptible"].jump
    assert found["preemptible"].window_seconds == 6 * HOUR
    assert found["standard"].per_node_hour == 0
    assert found["preemptible"].to_json()["mtbp_hours"] == pytest.approx(2.0)


def test_a_jump_shows_within_a_few_preemptions_and_a_quiet_spell_too():
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({"preemptible": 20})
    now = steady(tracker, 20, 0.1, 6)  # 12 in 6 h: 0.5 expected in 15 min
    later = now + timedelta(minutes=4)
    for minute in (1, 2, 3, 4):
        tracker.saw(f"pre{minute}", "preemptible", now + timedelta(minutes=minute), later)
    jumped = tracker.estimate(later)[0]
    assert jumped.jump and jumped.preemptions == 4 and jumped.window_seconds == 900
    assert jumped.per_node_hour == pytest.approx(4 / (20 * 0.25))
    calm = RateTracker(6 * HOUR, 900, T0)
    calm.set_pools({"preemptible": 20})
    now = steady(calm, 20, 2.0, 6)  # 10 expected in 15 min: none is a change
    quiet = calm.estimate(now + timedelta(minutes=20))[0]
    assert quiet.jump and quiet.per_node_hour == 0


def test_a_young_watcher_measures_over_the_time_it_has_watched():
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({"preemptible": 10})
    tracker.saw("pre1", "preemptible", T0 + timedelta(minutes=30), T0 + timedelta(hours=1))
    found = tracker.estimate(T0 + timedelta(hours=1))[0]
    assert found.window_seconds == HOUR and found.per_node_hour == pytest.approx(0.1)


def test_what_cannot_be_believed_never_moves_the_rate():
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({"preemptible": 4})
    now = T0 + timedelta(hours=2)
    assert not tracker.saw("pre1", "preemptible", now + timedelta(hours=1), now)  # in the future
    assert not tracker.saw("pre1", "preemptible", now - timedelta(hours=7), now)  # before the window
    assert not tracker.saw("x", "forged-pool", now, now)  # no such pool
    assert tracker.saw("pre1", "preemptible", now, now)
    assert tracker.saw("pre1", "preemptible", now, now)  # the same node and time: counted once
    assert tracker.estimate(now)[0].preemptions == 1


def test_published_file_is_taken_back_by_a_restarted_watcher_of_the_same_user_only(tmp_path):
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({"preemptible": 4})
    now = steady(tracker, 4, 0.5, 2)
    data = tracker.publish(tmp_path, now)
    on_disk = json.loads((tmp_path / rate.FILE_NAME).read_text())
    assert on_disk == data and on_disk["pools"]["preemptible"]["preemptions"] == 4
    assert rate.read_published(tmp_path) == data
    again = RateTracker(6 * HOUR, 900, now)
    again.set_pools({"preemptible": 4})
    assert again.take_back(tmp_path, now) == 4
    assert again.estimate(now)[0].per_node_hour == pytest.approx(0.5)
    if os.geteuid() == 0:
        os.chown(tmp_path / rate.FILE_NAME, 65534, 65534)
        stranger = RateTracker(6 * HOUR, 900, now)
        stranger.set_pools({"preemptible": 4})
        assert stranger.take_back(tmp_path, now) == 0


def test_a_corrupt_file_starts_afresh(tmp_path):
    (tmp_path / rate.FILE_NAME).write_text('{"since": 3, "times": {"preemptible": ["junk"]}}')
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({"preemptible": 4})
    assert tracker.take_back(tmp_path, T0) == 0
    assert rate.read_published(tmp_path) is None


def test_the_watcher_publishes_the_rate_of_the_drains_it_opens(world):
    fake: FakeSlurm = world.slurm
    watcher = world.watcher()
    assert watcher.poll_once().queries == 2  # quiet: the rate asks nothing
    world.clock.advance(HOUR)
    fake.drain(["pre1", "pre2"], REASON)
    watcher.poll_once()
    published = rate.read_published(world.state_dir)
    assert published is not None
    pool = published["pools"]["preemptible"]
    assert pool["nodes"] == 4 and pool["preemptions"] == 2
    assert pool["jump"] and pool["window_seconds"] == 900  # two at once after a quiet hour
    assert published["pools"]["standard"]["preemptions"] == 0
    world.clock.advance(60)
    assert watcher.poll_once().queries == 2  # pools counted a minute ago: no new count
