"""Reading a small file of ours where a user could have put something else (issue 28 item 4): notices
and events are read never through a link, never blocking on a FIFO, never past a size cap, and only
from the owners we believe. A hostile user's real files (``sp-mallory``) are used where owners matter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hostileusers import MALLORY, ensure_user
from slurm_preempt import trust
from slurm_preempt.notice import MAX_NOTICE_BYTES, Notice, notice_path, read_notice, write_notice

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _notice(job_id: str = "42") -> Notice:
    return Notice.for_drain(job_id, "pre1", "spot", "slurm", T0, 120, T0 + timedelta(seconds=1))


def _read_in_child(path: Path, timeout: float = 20) -> str:
    """read_notice in a child process: on a FIFO the old plain open() blocked for ever."""
    code = textwrap.dedent(
        f"""
        from slurm_preempt.notice import read_notice
        print(repr(read_notice({str(path)!r})))
        """
    )
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return done.stdout.strip()


def test_a_notice_we_wrote_reads_back(tmp_path):
    path = write_notice(notice_path(tmp_path, "42"), _notice())
    assert read_notice(path) == _notice()


def test_a_fifo_as_the_notice_never_blocks_the_reader(tmp_path):
    path = notice_path(tmp_path, "42")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    try:
        assert _read_in_child(path) == "None"
    except subprocess.TimeoutExpired:
        pytest.fail("read_notice blocked on a FIFO")


def test_a_link_as_the_notice_is_not_followed(tmp_path):
    real = write_notice(tmp_path / "elsewhere.json", _notice())
    path = notice_path(tmp_path, "42")
    path.parent.mkdir(parents=True)
    path.symlink_to(real)
    assert read_notice(path) is None


def test_a_huge_notice_is_not_read(tmp_path):
    path = notice_path(tmp_path, "42")
    path.parent.mkdir(parents=True)
    data = _notice().to_json()
    data["reason"] = "x" * MAX_NOTICE_BYTES
    path.write_text(json.dumps(data))
    assert read_notice(path) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_a_notice_of_another_user_is_not_believed(tmp_path):
    """Root reads a notice only from root, a listed writer or itself; a job from those and itself."""
    mallory, _ = ensure_user(MALLORY)
    path = write_notice(notice_path(tmp_path, "42"), _notice())
    os.chown(path, mallory, mallory)
    assert read_notice(path) is None  # as root (the watcher)
    assert read_notice(path, owners={mallory}) == _notice()  # as her own job would read it
    (tmp_path / trust.WRITERS).write_text(f"{mallory}\n")
    assert read_notice(path) == _notice()  # a listed writer (SlurmUser)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_a_writers_file_others_may_change_names_nobody(tmp_path):
    mallory, _ = ensure_user(MALLORY)
    writers = tmp_path / trust.WRITERS
    writers.write_text(f"{mallory}\n")
    writers.chmod(0o666)
    assert trust.writer_uids(tmp_path) == {0}
    writers.chmod(0o644)
    os.chown(writers, mallory, mallory)
    assert trust.writer_uids(tmp_path) == {0}


def test_read_small_refuses_what_is_not_a_small_regular_file(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 11)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "big")
    for name in ("big", "fifo", "link"):
        with pytest.raises(OSError):
            trust.read_small(tmp_path / name, 10)
    assert trust.read_small(tmp_path / "big", 11) == b"x" * 11
