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


# ------------------------------------------------------------------ bounds (issue 28, item 1)


def _flood(folder: Path, count: int, size: int, kind: str = "checkpoint_saved") -> None:
    """What a user can keep in their own job folder: many event-shaped files of padding."""
    pad = json.dumps({"kind": kind, "job_id": folder.name, "p": [{}] * ((size - 40) // 4)})
    for index in range(count):
        (folder / f"{index}-x-1-{kind}.json").write_text(pad)


def test_a_folder_past_the_entry_bound_is_unreadable_and_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(ledger, "MAX_ENTRIES", 50)
    ledger.record(tmp_path, "11", "attempt_start", source="hook")
    folder = tmp_path / "jobs" / "11"
    for index in range(60):
        (folder / f"junk-{index}").write_text("")  # names that are no events count as well
    for _ in range(3):
        with pytest.raises(ledger.LedgerUnreadable):
            ledger.events(tmp_path, "11")
    assert sum("not read: more than 50 entries" in r.getMessage() for r in caplog.records) == 1


def test_a_folder_past_the_byte_bound_is_not_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "MAX_FOLDER_BYTES", 200_000)
    ledger.record(tmp_path, "12", "attempt_start", source="hook")
    _flood(tmp_path / "jobs" / "12", 10, 63_000)
    parsed = []
    real = ledger.json.loads
    monkeypatch.setattr(ledger.json, "loads", lambda data: parsed.append(1) or real(data))
    with pytest.raises(ledger.LedgerUnreadable):
        ledger.events(tmp_path, "12")
    assert parsed == []  # sized from the listing, before any file is opened


def test_padding_inside_an_event_is_not_kept(tmp_path):
    folder = tmp_path / "jobs" / "13"
    folder.mkdir(parents=True)
    _flood(folder, 1, 60_000)
    (event,) = ledger.events(tmp_path, "13")
    assert "p" not in event and event["kind"] == "checkpoint_saved"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_find_opens_only_the_kind_asked_from_trusted_owners(tmp_path, monkeypatch):
    """The watcher's own check (told once) on a folder its owner flooded with files of that very kind:
    none of theirs is opened unless the folder is the job's user's, and the watcher's record is found."""
    mallory, _ = ensure_user(MALLORY)
    ledger.record(tmp_path, "14", "attempt_start", source="hook")
    folder = tmp_path / "jobs" / "14"
    _flood(folder, 200, 2_000, kind="signal_sent")
    forged = folder / "9-x-1-signal_sent.json"
    forged.write_text(json.dumps({"kind": "signal_sent", "job_id": "14", "event_id": "pre1@x"}))
    for path in folder.iterdir():
        os.chown(path, mallory, mallory)
    opened = []
    real = ledger.read_small
    monkeypatch.setattr(
        ledger, "read_small", lambda name, *a, **kw: opened.append(name) or real(name, *a, **kw)
    )
    assert ledger.find(tmp_path, "14", "signal_sent", None, event_id="pre1@x") is None
    assert opened == []  # the folder is mallory's, but mallory is not the job's user given
    os.chown(folder, 0, 0)
    assert ledger.find(tmp_path, "14", "signal_sent", mallory, event_id="pre1@x") is None  # not theirs
    os.chown(folder, mallory, mallory)
    assert ledger.find(tmp_path, "14", "signal_sent", mallory, event_id="pre1@x") == forged  # a sidecar's
    mine = ledger.record(tmp_path, "14", "signal_sent", source="watcher", event_id="pre2@y")
    opened.clear()
    assert ledger.find(tmp_path, "14", "signal_sent", None, event_id="pre2@y") == mine
    assert opened == [mine.name]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_find_parses_at_most_a_bounded_amount_of_the_owners_files(tmp_path, monkeypatch):
    """The job's own user (a sidecar) is believed for that kind, so padding under that kind's name is
    the one flood ``find`` would open: past MAX_FIND_BYTES it opens none and says the folder is unreadable."""
    mallory, _ = ensure_user(MALLORY)
    monkeypatch.setattr(ledger, "MAX_FIND_BYTES", 50_000)
    folder = tmp_path / "jobs" / "15"
    folder.mkdir(parents=True)
    _flood(folder, 20, 5_000, kind="signal_sent")
    for path in [folder, *folder.iterdir()]:
        os.chown(path, mallory, mallory)
    with pytest.raises(ledger.LedgerUnreadable, match="more than 50000"):
        ledger.find(tmp_path, "15", "signal_sent", mallory, event_id="pre1@x")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_a_folder_of_another_user_than_the_jobs_speaks_for_nothing(tmp_path):
    """Issue 28 item 3, for readers: root's attempt_start names the job's uid; a folder of someone else
    (an earlier job's with this id, kept where no prolog moved it) has none of its owner's events believed."""
    mallory, _ = ensure_user(MALLORY)
    alice_uid = mallory + 1
    ledger.record(tmp_path, "16", "attempt_start", source="hook", uid=str(alice_uid))
    folder = ledger.job_dir(tmp_path, "16")
    os.chown(folder, mallory, mallory)
    planted = ledger.record(tmp_path, "16", "requeued", source="job", event_id="pre1@x")
    os.chown(planted, mallory, mallory)
    assert [e["kind"] for e in ledger.trusted_events(tmp_path, "16")] == ["attempt_start"]
    os.chown(folder, alice_uid, alice_uid)
    os.chown(planted, alice_uid, alice_uid)
    assert [e["kind"] for e in ledger.trusted_events(tmp_path, "16")] == ["attempt_start", "requeued"]
