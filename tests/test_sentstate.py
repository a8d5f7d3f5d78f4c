"""The watcher's saved state: typed records that only its own methods change, each change marking the
state for saving, and the files earlier releases wrote (version 1 and 2), loaded and written back."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from slurm_preempt.watch import sentstate
from slurm_preempt.watch.sentstate import NodeEvent, Restarts, SentState, Telling

DATA = Path(__file__).resolve().parent / "data" / "watcher-state"
T0 = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)


def _saved(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "sent.json"
    path.write_text((DATA / name).read_text())
    return path


# ---------------------------------------------------------------------------------------- the files


def test_a_version_2_file_loads_and_is_written_back_as_it_was(tmp_path):
    path = _saved(tmp_path, "sent-v2.json")
    before = json.loads(path.read_text())
    state = sentstate.load(path)
    assert state.done("28069340", "pre1", "signal") and not state.done("28069341", "pre2", "signal")
    assert state.done("28069341", "pre2", "enforced") and state.events["pre2"].enforced
    assert state.telling("28069340", 1) == Telling("pre1@2026-12-01T06:00:00Z", T0 + timedelta(seconds=300))
    assert state.telling("28069340", 2) is None  # told in attempt 1, not in the next one
    assert state.restarts_of("28069338") == Restarts(launch_held=1, launch_moved=1)
    assert not state.changed  # loaded: nothing to write
    state.save()
    assert json.loads(path.read_text()) == before


def test_a_version_1_file_loads_and_is_written_back_once_as_version_2(tmp_path):
    path = _saved(tmp_path, "sent-v1.json")
    before = json.loads(path.read_text())
    state = sentstate.load(path)
    assert state.done("28069340", "pre1", "notice") and state.done("28069340", "pre1", "signal")
    assert state.told["28069340", "pre1"].attempt is None  # version 1: told in any attempt
    assert state.telling("28069340", 3) is None  # no deadline kept: a later drain tells it anew
    assert state.restarts_of("28069339") == Restarts(fast_restart=2, fallback="standard")
    state.save()
    migrated = json.loads(path.read_text())
    assert migrated == {**before, "version": 2}  # every entry as it was, under the new version
    again = sentstate.load(path)
    again.save()
    assert json.loads(path.read_text()) == migrated


def test_the_records_a_state_writes_are_the_ones_it_reads(tmp_path):
    state = SentState(tmp_path / "sent.json")
    state.open_event(NodeEvent("pre1", T0, "TogetherPreemptionNotified: reclaimed", "slurm", 300.0))
    state.mark_told("7", "pre1", "notice", T0, "pre1@x", attempt=0, deadline=T0 + timedelta(seconds=300))
    state.mark_told("7", "pre1", "signal", T0, "pre1@other", attempt=5, deadline=T0)  # the first ones stay
    state.record_fallback("8", "standard")
    state.record_fast_restart("8", 2)
    state.save()
    again = sentstate.load(state.path)
    assert again.to_json() == state.to_json()
    assert again.told["7", "pre1"] == state.told["7", "pre1"]
    assert again.told["7", "pre1"].event_id == "pre1@x" and again.told["7", "pre1"].attempt == 0
    assert again.restarts_of("8") == Restarts(fast_restart=2, fallback="standard")


@pytest.mark.parametrize(
    "entry",
    [
        {"told": {"1|pre1": {"notice": "2026-12-01T06:00:00Z"}}},  # no event
        {"told": {"1|pre1": {"event_id": "e", "notice": "soon"}}},  # a time that is none
        {"told": {"1|pre1": {"event_id": "e", "deadline": 5}}},
        {"told": {"1|pre1": {"event_id": "e", "attempt": "first"}}},
        {"restarts": {"1": {"fast_restart": "yes"}}},
        {"restarts": {"1": {"fallback": 3}}},
    ],
)
def test_an_entry_of_the_wrong_shape_is_a_corrupt_file(tmp_path, entry):
    """Read at load, so it is moved aside there (``watcher.load_sent``), not met in the middle of a poll."""
    path = tmp_path / "sent.json"
    path.write_text(json.dumps({"version": 2, **entry}))
    with pytest.raises(ValueError):
        sentstate.load(path)


# ---------------------------------------------------------------------------------------- changes


def test_every_change_marks_the_state_and_a_save_clears_it(tmp_path):
    state = SentState(tmp_path / "sent.json")
    assert state.changed  # no file yet: written once at start
    state.save()
    assert not state.changed
    changes = [
        lambda: state.open_event(NodeEvent("pre1", T0, "r", "slurm", 300.0)),
        lambda: state.set_handled("pre1", True),
        lambda: state.set_enforced("pre1", True),
        lambda: state.mark_told("1", "pre1", "notice", T0, "pre1@x"),
        lambda: state.record_fallback("2", "standard"),
        lambda: state.record_fast_restart("2", 1),
        lambda: state.record_launch_held("3", 1),
        lambda: state.record_launch_moved("3", 1),
        lambda: state.forget_jobs(keep={"2"}),
        lambda: state.forget_node("pre1"),
    ]
    for change in changes:
        change()
        assert state.changed
        state.save()
        assert not state.changed
    assert sentstate.load(state.path).to_json() == state.to_json()


def test_what_changes_nothing_leaves_nothing_to_write(tmp_path):
    state = SentState(tmp_path / "sent.json")
    state.open_event(NodeEvent("pre1", T0, "r", "slurm", 300.0, handled=True))
    state.record_fast_restart("2", 1)
    state.save()
    state.set_handled("pre1", True)
    state.set_enforced("gone", True)  # no such event
    state.saw("pre1")  # seen this run: decides what is logged, never saved
    state.record_fast_restart("2", 1)
    state.forget_jobs(keep={"2"})
    state.forget_node("pre9")
    assert not state.changed


def test_a_failed_save_leaves_the_change_to_write(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    state = SentState(blocked / "sent.json")
    state.record_fallback("1", "standard")
    with pytest.raises(OSError):
        state.save()
    assert state.changed


def test_the_records_are_read_only_outside_their_methods():
    state = SentState()
    state.open_event(NodeEvent("pre1", T0, "r", "slurm", 300.0))
    with pytest.raises(TypeError):
        state.events["pre2"] = NodeEvent("pre2", T0, "r", "slurm", 300.0)  # type: ignore[index]
    with pytest.raises(AttributeError):
        state.events["pre1"].handled = True  # type: ignore[misc]
    with pytest.raises(ValueError, match="not an act"):
        state.mark_told("1", "pre1", "attempt", T0, "pre1@x")


def test_forgetting_a_node_forgets_only_its_pairs():
    state = SentState()
    for node in ("pre1", "pre2"):
        state.open_event(NodeEvent(node, T0, "r", "slurm", 300.0))
        state.mark_told("7", node, "notice", T0, f"{node}@x", attempt=0, deadline=T0)
    state.forget_node("pre1")
    assert state.nodes_told("7") == {"pre2"} and list(state.told) == [("7", "pre2")]
    state.forget_node("pre2")
    assert state.told == {} and state.nodes_told("7") == set() and state.events == {}
