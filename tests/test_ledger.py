"""The ledger: atomic event files, and readers that tell root's events from anyone else's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hostileusers import MALLORY, as_user, ensure_user
from slurm_preempt import ledger
from slurm_preempt.records import history


def test_record_and_read_back_in_order(tmp_path):
    ledger.record(tmp_path, "42", "attempt_start", source="hook", restart_count=0)
    ledger.record(tmp_path, "42", "checkpoint_saved", source="job", step=5)
    found = ledger.events(tmp_path, "42")
    assert [e["kind"] for e in found] == ["attempt_start", "checkpoint_saved"]
    assert found[1]["step"] == 5 and found[0]["job_id"] == "42"
    assert not [p for p in (tmp_path / "jobs" / "42").iterdir() if p.name.startswith(".")]


def test_bad_kind_and_bad_job_id_are_refused(tmp_path):
    with pytest.raises(ValueError):
        ledger.record(tmp_path, "42", "made_up", source="job")
    with pytest.raises(ValueError):
        ledger.record(tmp_path, "../etc", "attempt_start", source="job")


def test_symlinks_fifos_garbage_and_huge_files_are_not_events(tmp_path):
    ledger.record(tmp_path, "7", "attempt_start", source="hook")
    folder = tmp_path / "jobs" / "7"
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"kind": "attempt_start", "job_id": "7"}))
    (folder / "1-x-1-attempt_start.json").symlink_to(secret)
    os.mkfifo(folder / "2-x-1-attempt_end.json")
    (folder / "3-x-1-attempt_end.json").write_text("{not json")
    (folder / "4-x-1-attempt_end.json").write_text(json.dumps({"kind": "attempt_end", "pad": "x" * 70000}))
    assert [e["kind"] for e in ledger.events(tmp_path, "7")] == ["attempt_start"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_only_root_files_are_trusted_for_root_kinds(tmp_path):
    ledger.record(tmp_path, "9", "attempt_start", source="hook", restart_count=0)
    folder = tmp_path / "jobs" / "9"
    os.chown(folder, 1234, 1234)
    forged = folder / "5-x-1-attempt_start.json"
    forged.write_text(json.dumps({"kind": "attempt_start", "job_id": "9", "restart_count": 3}))
    mine = folder / "6-x-1-checkpoint_saved.json"
    mine.write_text(json.dumps({"kind": "checkpoint_saved", "job_id": "9"}))
    other = folder / "7-x-1-checkpoint_saved.json"
    other.write_text(json.dumps({"kind": "checkpoint_saved", "job_id": "9"}))
    os.chown(forged, 1234, 1234)
    os.chown(mine, 1234, 1234)
    os.chown(other, 4321, 4321)
    moved = folder / "8-x-1-attempt_end.json"  # root's file, but of another job
    moved.write_text(json.dumps({"kind": "attempt_end", "job_id": "10"}))
    every = ledger.events(tmp_path, "9")
    assert len(every) == 5
    trusted = ledger.trusted_events(tmp_path, "9")
    kinds = sorted((e["kind"], e["_uid"]) for e in trusted)
    assert kinds == [("attempt_start", 0), ("checkpoint_saved", 1234)]


def test_job_ids_lists_only_job_folders(tmp_path):
    for job in ("12", "3", "100_2"):
        ledger.record(tmp_path, job, "attempt_start", source="hook")
    (tmp_path / "jobs" / ".hook-123-4").write_text("")
    assert ledger.job_ids(tmp_path) == ["3", "12", "100_2"]


def _swap_new_temp_files_for_links_to(victim, monkeypatch):
    """Play the owner of the job's folder: the moment a writer creates its temporary file, move that
    file away and put a symlink to ``victim`` under its name."""
    real_open = os.open

    def racing_open(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT and flags & os.O_EXCL:
            os.rename(path, f"{path}.moved", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.symlink(victim, path, dir_fd=dir_fd)
        return fd

    monkeypatch.setattr(os, "open", racing_open)


def test_a_user_swapping_names_in_their_folder_cannot_chmod_another_file(tmp_path, monkeypatch):
    """Root records events into the job owner's folder; the owner races the writer with a symlink to
    a file of root's (here: any file with mode 0600). Before the one write protocol, the writer set the
    mode by path and so made the victim world-readable."""
    victim = tmp_path / "shadow"
    victim.write_text("secret")
    victim.chmod(0o600)
    (tmp_path / "jobs" / "9").mkdir(parents=True)
    _swap_new_temp_files_for_links_to(victim, monkeypatch)
    ledger.record(tmp_path, "9", "checkpoint_saved", source="watcher", step=1)
    monkeypatch.undo()
    assert oct(victim.stat().st_mode & 0o777) == oct(0o600)
    assert victim.read_text() == "secret"


# ---------------------------------------------------------------------------------------- hostile


@pytest.mark.parametrize("job_id", ["../etc", "²", "٣", "1/2", "", "1 2", "-1", "9" * 11])
def test_job_ids_that_are_not_ascii_numbers_make_no_path(tmp_path, job_id):
    with pytest.raises(ValueError):
        ledger.job_dir(tmp_path, job_id)
    (tmp_path / "jobs").mkdir(exist_ok=True)
    if job_id and "/" not in job_id:
        (tmp_path / "jobs" / job_id).mkdir(exist_ok=True)
    assert ledger.job_ids(tmp_path) == []


def test_hostile_names_and_sizes_in_a_users_folder_never_break_reading(tmp_path):
    """Finding 9: a forged or huge-number file name broke `report` for everyone."""
    ledger.record(tmp_path, "7", "attempt_start", source="hook")
    folder = tmp_path / "jobs" / "7"
    event = json.dumps({"kind": "checkpoint_saved", "job_id": "7", "time": "2026-12-01T06:00:00Z"})
    for name in ("9" * 200 + "-x-checkpoint_saved.json", "²²-x.json", "-.json", "0-x.json"):
        (folder / name).write_text(event)
    (folder / "deep.json").write_text("[" * 100_000)
    (folder / "ten-k-times.json").write_text(json.dumps({"kind": "checkpoint_saved", "time": "9" * 10_000}))
    found = ledger.events(tmp_path, "7")
    assert [e["kind"] for e in found].count("attempt_start") == 1
    assert all(isinstance(e["_order"], int) for e in found)
    assert len(history.from_ledger("7", tmp_path).attempts) == 1  # what `report` reads for every job


def test_renaming_a_root_file_moves_nothing(tmp_path):
    """Finding 9: the owner of the folder renamed root's attempt file and the reported run time moved."""
    path = ledger.record(tmp_path, "7", "attempt_start", source="hook")
    before = ledger.events(tmp_path, "7")[0]["_order"]
    earlier = path.with_name(f"{before - 3600 * 10**9}-h-1-attempt_start.json")
    os.rename(path, earlier)
    assert ledger.events(tmp_path, "7")[0]["_order"] // 10**9 == before // 10**9


def _race_in(folder: Path, target: Path, stop_file: Path) -> None:
    """Run as the folder's owner (a real unprivileged user): swap every temporary name root creates for a
    symlink to ``target``, and rename finished events, until ``stop_file`` exists."""
    while not stop_file.exists():
        for name in os.listdir(folder):
            path = folder / name
            try:
                if name.endswith(".tmp"):
                    os.unlink(path)
                    os.symlink(target, path)
                elif name.endswith(".json"):
                    os.rename(path, folder / f"0-{name}")
            except OSError:
                pass


@pytest.mark.skipif(os.geteuid() != 0, reason="a real second user needs root to create")
def test_root_recording_into_a_folder_a_real_user_races(tmp_path):
    """Finding 3 as a user would act: root (the watcher, the hooks' Python twin) records events into
    the job owner's folder while that user, in their own process, swaps root's temporary names for
    links to a root-only file. 300 attempts: the file keeps its mode, owner and content; every record
    either lands or fails with OSError; nothing is written anywhere else."""
    uid, gid = ensure_user(MALLORY)
    os.chmod(tmp_path, 0o755)
    secret = tmp_path / "secret"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    folder = tmp_path / "jobs" / "9"
    folder.mkdir(parents=True)
    os.chown(folder, uid, gid)
    os.chmod(folder, 0o700)
    stop = tmp_path / "stop"
    pid = as_user(MALLORY, lambda: _race_in(folder, secret, stop))
    outcomes = {"written": 0, "refused": 0}
    try:
        for step in range(300):
            try:
                ledger.record(tmp_path, "9", "notice_sent", source="watcher", step=step)
                outcomes["written"] += 1
            except OSError:
                outcomes["refused"] += 1
    finally:
        stop.write_text("")
        os.waitpid(pid, 0)
    info = secret.stat()
    assert (info.st_uid, info.st_mode & 0o777, secret.read_text()) == (0, 0o600, "root only"), outcomes
    assert sum(outcomes.values()) == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs", "secret", "stop"]
