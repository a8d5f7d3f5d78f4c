"""The commit protocol: a kill between any two filesystem steps of save, replace and prune never hides
the last saved checkpoint; leftovers of any host are recovered or swept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from slurm_preempt import procinfo
from slurm_preempt.job import checkpoint_io, commit
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.commit import Owner, step_name


class Warnings(list):
    def __call__(self, message):
        self.append(message)


def payload(step: int, version: int) -> dict:
    return {"a.bin": bytes([version % 251]) * 30_000, "tag.txt": f"{step}:{version}".encode()}


def version_of(found) -> tuple[int, int]:
    step, version = bytes(found.load()["tag.txt"]).decode().split(":")  # a read-only view
    return int(step), int(version)


# ------------------------------------------------------------------------------ names and generations


def test_names_and_generations():
    assert step_name(42) == "step-000000000042"
    assert step_name(42, 3) == "step-000000000042.3"
    assert commit.parse_name("step-000000000042") == (42, 0)
    assert commit.parse_name("step-000000000042.3") == (42, 3)
    for bad in ("step-", "step-x", "step-12.x", "step-12.", ".tmp-a-1-b", "other"):
        assert commit.parse_name(bad) is None
    assert commit.aside_step(".old-node_1-123-step-000000000007") == 7
    assert commit.aside_step(".old-node_1-123-junk") is None


def test_a_resave_is_a_new_generation_and_the_old_one_goes_after(tmp_path):
    store = CheckpointStore(tmp_path)
    first = store.save(7, b"first")
    second = store.save(7, b"second")
    assert first.path.name == "step-000000000007" and second.path.name == "step-000000000007.1"
    found, payload = store.restore()
    assert (found.step, payload) == (7, b"second")
    store.settle()
    assert sorted(os.listdir(tmp_path)) == ["step-000000000007.1"]
    assert store.save(7, b"third").path.name == "step-000000000007.2"


def test_commit_never_overwrites_a_folder_that_appeared_meanwhile(tmp_path):
    """Two writers racing for the same name: rename(2) refuses a non-empty target, the loser takes the
    next generation; neither checkpoint is lost."""
    store = CheckpointStore(tmp_path)
    store.save(3, b"one")
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "x").write_bytes(b"y")
    real_committed = commit.committed
    calls = []

    def stale_listing(directory):
        calls.append(1)
        return [] if len(calls) == 1 else real_committed(directory)  # first look misses step-3.0

    commit.committed = stale_listing
    try:
        target = commit.commit(tmp_path, folder, 3)
    finally:
        commit.committed = real_committed
    assert target.name == "step-000000000003.1"
    assert (tmp_path / "step-000000000003" / "MANIFEST.json").exists()


# ------------------------------------------------------------------------------ a kill at every step


def _run_killed_at(kill_at: int, action) -> tuple[int, list[str]]:
    """Fork; in the child run ``action`` with a SIGKILL at filesystem step number ``kill_at``.
    Returns (how the child ended: signal number or 0, the steps it passed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        seen = 0

        def hook(what: str) -> None:
            nonlocal seen
            os.write(write_end, (what + "\n").encode())
            if seen == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            seen += 1

        try:
            checkpoint_io.step_hook = hook
            action()
        finally:
            os._exit(0)
    os.close(write_end)
    steps = b""
    while chunk := os.read(read_end, 65536):
        steps += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return (os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0), steps.decode().splitlines()


def _prepare(directory: Path, saves: list[tuple[int, int]], keep: int) -> None:
    store = CheckpointStore(directory, keep=keep)
    for step, version in saves:
        store.save(step, payload(step, version))
    store.settle()


def _kill_everywhere(tmp_path, before, action, check, keep=2):
    """Run ``action`` once per filesystem step, killed right before that step; ``check`` the store.
    ``before``: the saves to make first, or a function preparing the folder."""
    seen_steps: list[str] = []
    for kill_at in range(10_000):
        directory = tmp_path / f"k{kill_at}"
        if callable(before):
            before(directory)
        else:
            _prepare(directory, before, keep)
        ended, steps = _run_killed_at(kill_at, lambda d=directory: action(d, keep))
        if ended == 0:
            assert kill_at > 5, f"the action passed only {kill_at} filesystem steps"
            return seen_steps
        assert ended == signal.SIGKILL
        seen_steps.append(steps[-1])
        warned = Warnings()
        found = CheckpointStore(directory, keep=keep, warn=warned).latest()
        assert warned == [], f"killed before {steps[-1]!r}: a damaged checkpoint was visible"
        assert found is not None, f"killed before {steps[-1]!r}: no checkpoint found"
        check(found, steps[-1])
        _recovers(directory, keep, found)
    raise AssertionError("the action never finished")


def _recovers(directory: Path, keep: int, found) -> None:
    """The next save (same host, the killed process gone) sweeps every leftover and prunes."""
    store = CheckpointStore(directory, keep=keep)
    store.save(found.step + 1, payload(found.step + 1, 99))
    store.settle()
    names = os.listdir(directory)
    assert all(commit.parse_name(n) for n in names), f"leftovers after recovery: {sorted(names)}"
    assert len(names) == min(keep, len(store.steps())) and store.latest().step == found.step + 1


def test_a_kill_at_any_step_of_a_save_and_its_prune(tmp_path):
    def action(directory, keep):
        store = CheckpointStore(directory, keep=keep)
        store.save(3, payload(3, 30))
        store.settle()

    def check(found, where):
        assert version_of(found) in ((2, 20), (3, 30)), where

    seen = _kill_everywhere(tmp_path, [(1, 10), (2, 20)], action, check)
    for step in ("mkdir scratch", "write owner", "create a.bin", "write a.bin", "fsync a.bin"):
        assert step in seen
    for step in ("create MANIFEST.json", "remove owner", "fsync folder", "rename into place"):
        assert step in seen
    assert {"fsync store folder", "rename to trash", "unlink", "rmdir"} <= set(seen)


def test_a_kill_at_any_step_of_a_resave_keeps_one_complete_copy(tmp_path):
    """Re-saving the newest step (a final checkpoint at the step a periodic save just wrote)."""

    def action(directory, keep):
        store = CheckpointStore(directory, keep=keep)
        store.save(2, payload(2, 21))
        store.settle()

    def check(found, where):
        assert version_of(found) in ((2, 20), (2, 21)), f"killed before {where}: got {version_of(found)}"

    seen = _kill_everywhere(tmp_path, [(1, 10), (2, 20)], action, check)
    assert "rename to trash" in seen  # the old generation goes only after the new one is in place


def test_a_kill_at_any_step_of_a_background_save(tmp_path):
    def action(directory, keep):
        store = CheckpointStore(directory, keep=keep)
        store.save(3, {"state": payload(3, 30)}, background=True)
        store.settle()

    def check(found, where):
        assert found.step in (2, 3), where

    _kill_everywhere(tmp_path, [(1, 10), (2, 20)], action, check)


def test_a_kill_at_any_step_of_copying_paths(tmp_path):
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "x.txt").write_text("x")
    (source / "y.txt").write_text("y")

    def action(directory, keep):
        store = CheckpointStore(directory, keep=keep)
        store.save_paths(3, [source])
        store.settle()

    def check(found, where):
        assert found.step in (2, 3), where
        if found.step == 3:
            assert (found.path / "src" / "sub" / "x.txt").read_text() == "x"

    _kill_everywhere(tmp_path, [(1, 10), (2, 20)], action, check)


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_kill_at_any_step_of_sweeping_the_leftovers_of_a_killed_saver(tmp_path):
    """The first save after a crash sweeps a dead saver's scratch folder and trash, and puts back the
    aside folder of an older version; killed anywhere in that, the store is still whole."""
    me = Owner.current()
    dead = Owner(me.host, _dead_pid(), me.boot_id, me.pid_namespace)

    def before(directory):
        _prepare(directory, [(1, 10), (2, 20)], keep=2)
        scratch = commit.Scratch(directory, dead)
        (scratch.path / "a.bin").write_bytes(b"half")
        os.rename(directory / step_name(1), directory / f".del-x-{dead.pid}-0000")
        os.rename(
            directory / step_name(2),
            directory / f".old-{commit._short_host(me.host)}-{dead.pid}-{step_name(2)}",
        )

    def action(directory, keep):
        store = CheckpointStore(directory, keep=keep)
        store.save(3, payload(3, 30))
        store.settle()

    def check(found, where):
        assert version_of(found) in ((2, 20), (3, 30)), where

    seen = _kill_everywhere(tmp_path, before, action, check)
    assert "rename aside back" in seen


# ------------------------------------------------------------------------------ leftovers of other hosts

HOST_A = Owner(host="node-a", pid=4242, boot_id="boot-a", job_id="77", restart_count=0)


def _leftovers_of(directory: Path, owner: Owner) -> None:
    """What a saver on host A leaves when the node is taken away mid-save: a scratch folder being
    written and a checkpoint renamed to trash but not yet deleted."""
    _prepare(directory, [(1, 10), (2, 20)], keep=3)
    scratch = commit.Scratch(directory, owner)
    (scratch.path / "a.bin").write_bytes(b"half")
    os.rename(directory / step_name(1), directory / ".del-node_a-4242-0000")


def _other_host(**fields) -> Owner:
    return Owner(host="node-b", pid=os.getpid(), boot_id="boot-b", **fields)


def test_the_next_attempt_on_another_host_sweeps_the_first_hosts_leftovers(tmp_path):
    _leftovers_of(tmp_path, HOST_A)
    store = CheckpointStore(tmp_path, owner=_other_host(job_id="77", restart_count=1))
    assert store.latest().step == 2
    store.save(3, payload(3, 30))
    store.settle()
    assert sorted(os.listdir(tmp_path)) == [step_name(2), step_name(3)]


def test_another_job_leaves_a_fresh_leftover_alone_until_its_heartbeat_is_old(tmp_path):
    """No Slurm identity in common: the owner's heartbeat age decides, measured on the file server's
    clock (the mtime of a file we just wrote), so the hosts' own clocks do not matter."""
    _leftovers_of(tmp_path, HOST_A)
    scratch = next(p for p in tmp_path.iterdir() if p.name.startswith(".tmp-"))
    store = CheckpointStore(tmp_path, owner=_other_host())
    store.save(3, payload(3, 30))
    store.settle()
    assert scratch.exists(), "a save that may still be running on another host was deleted"
    old = time.time() - commit.STALE_AFTER - 60
    os.utime(scratch / ".owner", (old, old))
    store.save(4, payload(4, 40))
    store.settle()
    assert not scratch.exists()


def test_a_heartbeat_keeps_a_long_save_fresh(tmp_path):
    scratch = commit.Scratch(tmp_path, HOST_A)
    old = time.time() - 3600
    os.utime(scratch.path / ".owner", (old, old))
    scratch.start_heartbeat(every=0.01)
    deadline = time.monotonic() + 30
    while (scratch.path / ".owner").stat().st_mtime == old and time.monotonic() < deadline:
        time.sleep(0.01)
    scratch.stop_heartbeat()
    assert (scratch.path / ".owner").stat().st_mtime > old


def test_same_host_pid_reused_by_another_process_is_not_the_saver(tmp_path):
    me = Owner.current()
    ghost = Owner(
        host=me.host, pid=os.getpid(), boot_id=me.boot_id, pid_namespace=me.pid_namespace, pid_start="1"
    )
    assert ghost.gone(me) is True  # our pid, but a process that started at another time
    assert Owner.current().gone(me) is False


def test_without_proc_a_saver_is_asked_by_its_pid_alone(monkeypatch):
    me = Owner.current()
    assert me.pid_start == str(procinfo.start_ticks(os.getpid()))  # as .owner holds it
    monkeypatch.setattr(procinfo, "read", lambda _pid: None)
    assert Owner.current().pid_start == ""
    assert commit.process_running(os.getpid(), me.pid_start)  # kill(pid, 0): it is there
    assert not commit.process_running(_dead_pid(), me.pid_start)


def test_aside_folder_of_an_older_version_is_read_and_put_back(tmp_path):
    """A re-save by a version before generations existed, killed between its two renames, left step 2
    only as ``.old-...-step-2``: restore uses it at once; a save puts it back once its writer is known
    gone (an old version records no owner: on another host, by age)."""
    _prepare(tmp_path, [(1, 10), (2, 20)], keep=3)
    aside = tmp_path / ".old-node_a-4242-step-000000000002"
    os.rename(tmp_path / step_name(2), aside)
    warned = Warnings()
    store = CheckpointStore(tmp_path, owner=_other_host(job_id="77", restart_count=1), warn=warned)
    found = store.latest()
    assert version_of(found) == (2, 20) and warned == []
    old = time.time() - commit.STALE_AFTER - 60
    os.utime(aside, (old, old))
    store.save(3, payload(3, 30))
    store.settle()
    assert sorted(os.listdir(tmp_path)) == [step_name(1), step_name(2), step_name(3)]


def test_aside_folder_superseded_by_a_newer_save_of_its_step_is_removed(tmp_path):
    _prepare(tmp_path, [(1, 10), (2, 20)], keep=3)
    aside = tmp_path / ".old-node_a-4242-step-000000000002"
    shutil.copytree(tmp_path / step_name(2), aside)  # killed after a newer save of step 2 committed
    old = time.time() - commit.STALE_AFTER - 60
    os.utime(aside, (old, old))
    store = CheckpointStore(tmp_path, owner=_other_host(job_id="77", restart_count=1))
    store.save(2, payload(2, 21))
    store.settle()
    assert version_of(store.latest()) == (2, 21)
    assert sorted(os.listdir(tmp_path)) == [step_name(1), step_name(2, 1)]


def test_owner_record_round_trips_and_rejects_garbage(tmp_path):
    me = Owner.current(environ={"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "2"})
    assert me.job_id == "5" and me.restart_count == 2 and me.pid == os.getpid()
    assert Owner.from_json(json.loads(json.dumps(me.__dict__))) == me
    assert Owner.from_json({"host": "x"}) is None and Owner.from_json([1]) is None
    assert Owner.current(environ={}).restart_count == -1


def test_earlier_attempt_of_the_same_job_is_gone_later_or_other_job_unknown():
    later = _other_host(job_id="77", restart_count=1)
    assert HOST_A.gone(later) is True
    assert HOST_A.gone(_other_host(job_id="78", restart_count=5)) is None
    assert HOST_A.gone(_other_host(job_id="77", restart_count=0)) is None


@pytest.mark.parametrize("name", [".tmp-node_a-4242-abcd", ".tmp-weird"])
def test_scratch_without_owner_record_is_judged_by_name_or_age(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    commit.sweep(tmp_path, _other_host())
    assert folder.exists()
    old = time.time() - commit.STALE_AFTER - 60
    os.utime(folder, (old, old))
    commit.sweep(tmp_path, _other_host())
    assert not folder.exists()
