"""The restart ledger: one small JSON file per event, under a per-job folder of the state directory.

Layout::

    <state_dir>/jobs/<job_id>/<time_ns>-<host>-<pid>-<kind>.json

Each file is written under a temporary name and renamed, so a reader never sees half an event, and
no two hosts ever append to one file (the state directory is usually NFS). Kinds:

    attempt_start  attempt_end  notice_sent  signal_sent  checkpoint_saved  resumed_from
    requeued  fast_restart  fallback  enforced_requeue

Every event carries ``kind``, ``job_id``, ``time`` (UTC ISO), ``host`` and ``source`` (``hook``,
``watcher``, ``job``, ``drill``). The prolog/epilog hooks write the same shape from shell.
Import-light: standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .notice import to_text, utcnow

KINDS = (
    "attempt_start",
    "attempt_end",
    "notice_sent",
    "signal_sent",
    "checkpoint_saved",
    "resumed_from",
    "requeued",
    "fast_restart",
    "fallback",
    "enforced_requeue",
)


def job_dir(state_dir: Path | str, job_id: str) -> Path:
    job_id = str(job_id)
    if not job_id.replace("_", "").isdigit():
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return Path(state_dir) / "jobs" / job_id


def record(state_dir: Path | str, job_id: str, kind: str, source: str, **fields) -> Path:
    """Write one event; return its path. Raises OSError when the state folder is not writable."""
    if kind not in KINDS:
        raise ValueError(f"unknown ledger event kind {kind!r}")
    folder = job_dir(state_dir, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    event = {
        "kind": kind,
        "job_id": str(job_id),
        "time": to_text(utcnow()),
        "host": host,
        "source": source,
        **fields,
    }
    name = f"{time.time_ns()}-{host}-{os.getpid()}-{kind}.json"
    fd, tmp = tempfile.mkstemp(prefix=".event-", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(event, handle, default=str)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return folder / name


def events(state_dir: Path | str, job_id: str) -> list[dict]:
    """All readable events of a job, oldest first (by the time in the file name, then name)."""
    folder = job_dir(state_dir, job_id)
    return sorted(_read_all(folder), key=lambda e: (e["_order"], e.get("_file", "")))


def _read_all(folder: Path) -> Iterator[dict]:
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            # O_NOFOLLOW: an event file that is a symlink is not an event.
            fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as handle:
                event = json.load(handle)
        except (OSError, ValueError):
            continue
        if not isinstance(event, dict) or "kind" not in event:
            continue
        head = name.split("-", 1)[0]
        event["_order"] = int(head) if head.isdigit() else 0
        event["_file"] = name
        yield event


def job_ids(state_dir: Path | str) -> list[str]:
    """Every job with a ledger folder."""
    try:
        return sorted(os.listdir(Path(state_dir) / "jobs"), key=lambda j: (len(j), j))
    except OSError:
        return []
