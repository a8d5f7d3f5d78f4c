"""durable.write_atomic: the one write protocol for small files (the checkpoint data path is tested in
test_checkpoint.py)."""

from __future__ import annotations

import os

import pytest

from slurm_preempt import durable


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_writes_replaces_and_sets_the_mode_whatever_the_umask(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    old_umask = os.umask(0o077)
    try:
        durable.write_atomic(target, "new", 0o644)
        durable.write_atomic(tmp_path / "hook", b"#!/bin/sh\n", 0o755)
    finally:
        os.umask(old_umask)
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "hook").stat().st_mode & 0o777 == 0o755
    assert _leftovers(tmp_path) == []


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old")

    def full_disk(_fd, _data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        durable.write_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_a_symlink_at_the_target_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "event.json").symlink_to(victim)
    durable.write_atomic(folder / "event.json", "{}")
    assert victim.read_text() == "keep"
    assert not (folder / "event.json").is_symlink() and (folder / "event.json").read_text() == "{}"


def test_a_planted_temporary_name_is_never_opened(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    names = iter(["planted", "free"])
    monkeypatch.setattr(durable, "_random_suffix", lambda: next(names))
    (tmp_path / ".x.json.planted.tmp").symlink_to(victim)
    durable.write_atomic(tmp_path / "x.json", "{}")
    assert victim.read_text() == "keep" and (tmp_path / "x.json").read_text() == "{}"


def test_a_folder_that_is_a_symlink_of_the_writer_is_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)  # an admin's /etc/slurm -> /shared/...: ours, so followed
    durable.write_atomic(tmp_path / "link" / "f", "x")
    assert (real / "f").read_text() == "x"


def test_a_folder_that_is_a_symlink_of_another_user_is_refused(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    if os.geteuid() == 0:
        os.lchown(tmp_path / "link", 4242, 4242)  # planted by a user
    else:
        monkeypatch.setattr(os, "geteuid", lambda: 4242)  # as if the writer were someone else
    with pytest.raises(PermissionError, match="not following a symlink"):
        durable.write_atomic(tmp_path / "link" / "f", "x")
    assert not (real / "f").exists()
