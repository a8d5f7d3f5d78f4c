"""The outbox: a batch of signals is claimed once, sent once, and its outcome outlives its watcher.

The helper process is tested here with a stand-in ``scancel`` on PATH that records what it was asked
(this is about our processes and files, not about Slurm); the real scancel on the real cluster is in
test_watcher_pair.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from clusterutil import wait_for
from slurm_preempt.watch import outbox
from slurm_preempt.watch.outbox import Batch, Item, Outbox
from slurm_preempt.watch.sentstate import write_atomic

ITEMS = [Item("11", "11", "pre1", "pre1@T"), Item("12", "10_2", "pre2", "pre2@T")]


class Recorder:
    """A WatcherSlurm with only the call the outbox makes."""

    def __init__(self, stderr: str = ""):
        self.calls: list[tuple[list[str], str]] = []
        self.stderr = stderr

    def signal_many(self, job_ids, signal, *, batch_only=False):
        self.calls.append((list(job_ids), signal))
        return self.stderr


def _queued(box: Outbox, wanted):
    """What tell_many does before sending: name the batches, write their intents."""
    batches = box.plan(wanted)
    box.write(batches)
    return batches


def _stub_scancel(tmp_path: Path, seconds: float = 0.0) -> dict[str, str]:
    """A `scancel` that sleeps, then appends its argv to a file; the environment that finds it."""
    folder = tmp_path / "bin"
    folder.mkdir()
    record = tmp_path / "scancel.calls"
    stub = folder / "scancel"
    stub.write_text(f'#!/bin/sh\nsleep {seconds}\necho "$@" >> {record}\n')
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "SP_RECORD": str(record)}


def test_a_batch_is_claimed_by_one_actor_only(tmp_path):
    box = Outbox(tmp_path / "outbox", Recorder())
    (batch,) = _queued(box, [("USR1", ITEMS)])
    intent = tmp_path / "outbox" / f"{batch.name}.intent"
    first, second = Recorder(), Recorder()
    assert outbox.act(intent, first) and not outbox.act(intent, second)
    assert first.calls == [(["11", "10_2"], "USR1")] and second.calls == []
    (done,) = (tmp_path / "outbox").glob("*.done")
    assert json.loads(done.read_text())["stderr"] == ""


def test_outcomes_stay_until_the_watcher_confirmed_them(tmp_path):
    slurm = Recorder(stderr="scancel: error: Kill job error on job id 11: Access/permission denied")
    box = Outbox(tmp_path / "outbox", slurm)
    finished, in_flight = box.send(_queued(box, [("USR1", ITEMS)]))
    assert in_flight == set() and finished[0].stderr.endswith("permission denied")
    assert len(list((tmp_path / "outbox").glob("*.done"))) == 1  # a watcher killed here loses nothing
    again, _ = Outbox(tmp_path / "outbox", Recorder()).leftovers()
    assert [b.name for b in again] == [finished[0].name] and again[0].stderr == finished[0].stderr
    box.finish(finished)
    assert list((tmp_path / "outbox").iterdir()) == []


def test_the_helper_outlives_a_watcher_killed_while_it_sends(tmp_path):
    env = _stub_scancel(tmp_path, seconds=2)
    folder = tmp_path / "outbox"
    watcher = textwrap.dedent(
        f"""
        from pathlib import Path
        from slurm_preempt.watch.outbox import Item, Outbox
        from slurm_preempt.slurm.commands import Slurm
        box = Outbox(Path({str(folder)!r}), Slurm(timeout=20), detached=True, timeout=20)
        items = [Item("11", "11", "pre1", "e"), Item("12", "12", "pre1", "e")]
        batches = box.plan([("USR1", items)])
        box.write(batches)
        box.send(batches)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", watcher], env=env)
    wait_for(lambda: list(folder.glob("*.claimed")), 20, 0.02, what="the helper's claim")
    child.send_signal(signal.SIGKILL)  # the watcher dies while its helper waits for scancel
    child.wait(10)
    done = wait_for(lambda: list(folder.glob("*.done")), 20, 0.1, what="the helper's outcome")
    assert json.loads(done[0].read_text())["stderr"] == ""
    assert Path(env["SP_RECORD"]).read_text().split() == ["--signal=USR1", "--batch", "11", "12"]
    finished, in_flight = Outbox(folder, Recorder()).leftovers()  # the next watcher reads it
    assert [len(b.items) for b in finished] == [2] and in_flight == set()


def test_an_intent_left_unclaimed_is_sent_by_the_next_watcher(tmp_path):
    box = Outbox(tmp_path / "outbox", Recorder())
    _queued(box, [("USR1", ITEMS)])  # then the watcher dies before sending
    slurm = Recorder()
    finished, in_flight = Outbox(tmp_path / "outbox", slurm).leftovers()
    assert slurm.calls == [(["11", "10_2"], "USR1")] and len(finished) == 1 and in_flight == set()


def test_no_folder_means_in_memory(tmp_path):
    slurm = Recorder()
    box = Outbox(None, slurm)
    finished, _ = box.send(_queued(box, [("USR1", ITEMS[:1]), ("USR2", ITEMS[1:])]))
    assert sorted(slurm.calls) == [(["10_2"], "USR2"), (["11"], "USR1")] and len(finished) == 2
    assert box.leftovers() == ([], set())


def test_a_planted_or_broken_intent_is_set_aside_never_sent(tmp_path, caplog):
    """An intent makes the watcher run scancel (as root, for the daemon): only a valid batch in a file
    of the watcher's own uid is ever sent."""
    folder = tmp_path / "outbox"
    box = Outbox(folder, Recorder())
    _queued(box, [("USR1", ITEMS)])  # creates the folder, mode 700
    for intent in folder.glob("*.intent"):
        intent.unlink()

    def batch(signal="USR1", job_id="1", display_id="1"):
        return {
            "signal": signal,
            "items": [{"job_id": job_id, "display_id": display_id, "node": "n", "event_id": "e"}],
        }

    bad = {
        "a.intent": batch(signal="KILL"),
        "b.intent": batch(job_id="1;rm"),
        "c.intent": batch(display_id="-1"),
        "d.intent": ["not", "a", "batch"],
    }
    for name, data in bad.items():
        (folder / name).write_text(json.dumps(data))
    foreign = folder / "e.intent"
    foreign.write_text(json.dumps({"signal": "USR1", "items": []}))
    os.chown(foreign, 65534, 65534)  # nobody's
    slurm = Recorder()
    finished, in_flight = Outbox(folder, slurm).leftovers()
    assert slurm.calls == [] and finished == [] and in_flight == set()
    assert sorted(p.name for p in folder.iterdir()) == [f"{n}.corrupt" for n in "abcde"]


def test_an_outbox_folder_others_may_write_is_not_used(tmp_path, caplog):
    folder = tmp_path / "outbox"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    slurm = Recorder()
    box = Outbox(folder, slurm)
    finished, _ = box.send(_queued(box, [("USR1", ITEMS)]))
    assert slurm.calls == [(["11", "10_2"], "USR1")] and len(finished) == 1  # sent from memory
    assert list(folder.iterdir()) == []
    assert sum("cannot be trusted" in r.getMessage() for r in caplog.records) == 1


def test_the_helper_sends_each_intent_named_on_its_pipe_and_exits_when_the_pipe_closes(tmp_path):
    env = _stub_scancel(tmp_path, seconds=0.5)
    folder = tmp_path / "outbox"
    folder.mkdir(mode=0o700)
    argv = [sys.executable, "-m", "slurm_preempt.watch.sender", "--serve", "20"]
    helper = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, text=True)
    intents = [folder / "1.intent", folder / "2.intent"]
    for number, intent in enumerate(intents):
        write_atomic(intent, json.dumps(Batch(str(number), "USR1", ITEMS[number : number + 1]).to_json()))
    helper.stdin.write(f"{intents[0]}\n{intents[1]}\n{intents[0]}\n")  # the third: claimed already
    helper.stdin.close()  # the watcher is gone: what was claimed is still sent
    assert helper.wait(30) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["1.done", "2.done"]
    calls = sorted(Path(env["SP_RECORD"]).read_text().splitlines())
    assert calls == ["--signal=USR1 --batch 10_2", "--signal=USR1 --batch 11"]


def test_the_helper_never_imports_from_the_watchers_working_directory(tmp_path, monkeypatch):
    """Issue 28 item 5: an admin starts the watcher from a folder a user can write, where that user
    planted ``slurm_preempt/watch/sender.py``; the helper runs ours, from "/", and the plant never runs."""
    env = _stub_scancel(tmp_path)
    planted = tmp_path / "cwd" / "slurm_preempt" / "watch"
    planted.mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    for init in (planted.parent / "__init__.py", planted / "__init__.py"):
        init.write_text("")
    (planted / "sender.py").write_text(f"open({str(marker)!r}, 'w').write(__import__('os').getcwd())\n")
    monkeypatch.chdir(planted.parent.parent)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", ".", *sys.path[1:2]]))  # relative entries too
    folder = tmp_path / "outbox"
    box = Outbox(folder, Recorder(), detached=True, timeout=20)
    batches = _queued(box, [("USR1", ITEMS[:1])])
    finished, in_flight = box.send(batches)
    box.close()
    assert not marker.exists()
    assert (len(finished), in_flight) == (1, set())
    assert Path(env["SP_RECORD"]).read_text().split() == ["--signal=USR1", "--batch", "11"]
