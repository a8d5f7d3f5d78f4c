"""The restart ledger: one small JSON file per event, under a per-job folder of the state directory.

Layout::

    <state_dir>/jobs/<job_id>/<time_ns>-<host>-<pid>-<kind>.json

Each file is written with ``durable.write_atomic``, so a reader never sees half an event, and no two
hosts ever append to one file (the state directory is usually NFS). Kinds:

    attempt_start  attempt_end  notice_sent  signal_sent  checkpoint_saved  resumed_from
    requeued  fast_restart  fallback  enforced_requeue  launch_held  shrunk

Every event carries ``kind``, ``job_id``, ``time`` (UTC ISO), ``host`` and ``source`` (``hook``,
``watcher``, ``job``, ``drill``). The prolog/epilog hooks write the same shape from shell.

Trust: the prolog creates ``jobs/<job_id>/`` as root and gives it to the job's owner with mode 0700, so
the job can add its own events and no other user can read or add any. ``jobs/`` itself stays root's.
A reader learns who wrote each file from its owner (``_uid``), never from its content: ``_trusted``
is true only for a regular file of root (or of a uid listed in the root-owned ``<state_dir>/writers``,
SlurmUser's, for EpilogSlurmctld) whose ``job_id`` matches its folder. History believes
attempts only when trusted; every other kind (checkpoints, notices of a sidecar watcher) also from the
owner of the job's folder.

Robust to what a user can put in their own folder: names that are not events, numbers of any size,
links, FIFOs, huge files, renamed root files. The order and time of an event come from its content
(root's files cannot be edited by the folder's owner, only renamed); the nanoseconds in a file's name
are used only when they agree with the time inside it, so renaming a root file moves nothing.
Import-light: standard library only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from slurm_preempt import ids
from slurm_preempt.durable import write_atomic
from slurm_preempt.notice import from_text, to_text, utcnow

# Kinds only root's hooks (or SlurmUser's EpilogSlurmctld) write; from anyone else they are forged.
# A watcher may run as the job's owner (a sidecar), so its kinds are also believed from the owner: they
# only speak about the owner's own job.
ROOT_KINDS = frozenset({"attempt_start", "attempt_end"})
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
    "launch_held",
    "shrunk",
)


MAX_EVENT_BYTES = 64 * 1024
WRITERS = "writers"  # <state_dir>/writers: uids (one a line) besides root whose events are trusted


def writer_uids(state_dir: Path | str) -> frozenset[int]:
    """Root, and the uids ``hooks install`` named (SlurmUser), if that file is root's and closed."""
    uids = {0}
    try:
        fd = os.open(Path(state_dir) / WRITERS, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return frozenset(uids)
    with os.fdopen(fd) as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid == 0 and not info.st_mode & 0o022 and stat.S_ISREG(info.st_mode):
            uids |= {int(word) for word in handle.read(4096).split() if re.fullmatch(r"[0-9]{1,10}", word)}
    return frozenset(uids)


def job_dir(state_dir: Path | str, job_id: str) -> Path:
    """``<state_dir>/jobs/<job_id>``; ValueError unless ``job_id`` is a job id (never ``..``, ``²``)."""
    return Path(state_dir) / "jobs" / ids.job_id(str(job_id))


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
        "time": to_text(utcnow(), "milliseconds"),  # phases of a drain last a fraction of a second
        "host": host,
        "source": source,
        **fields,
    }
    name = f"{time.time_ns()}-{host}-{os.getpid()}-{kind}.json"
    # The folder belongs to the job's user while root's hooks and the watcher write here too: the one
    # write protocol is safe against that user renaming or planting names meanwhile. Not fsynced (as
    # the hooks' own events are not): an event is history on shared storage, whose client flushes it
    # at close, and a job writes one between its final checkpoint and its requeue, the path that races
    # the deadline.
    return write_atomic(folder / name, json.dumps(event, default=str), 0o644, sync=False)


def events(state_dir: Path | str, job_id: str) -> list[dict]:
    """All readable events of a job, oldest first (by the time in the file name, then name)."""
    folder = job_dir(state_dir, job_id)
    return sorted(_read_all(folder), key=lambda e: (e["_order"], e.get("_file", "")))


def trusted_events(state_dir: Path | str, job_id: str) -> list[dict]:
    """The events a report may believe: root's of every kind, the job owner's only of job kinds."""
    out = []
    for event in events(state_dir, job_id):
        if event["_trusted"] or (event["kind"] not in ROOT_KINDS and event["_uid"] == event["_folder_uid"]):
            out.append(event)
    return out


def _read_all(folder: Path) -> Iterator[dict]:
    try:
        names = os.listdir(folder)
        folder_uid = os.stat(folder).st_uid
    except OSError:
        return
    trusted_uids = writer_uids(folder.parent.parent)
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        event = _read_one(folder / name)
        if event is None:
            continue
        event["_order"] = _order(name, event)
        event["_file"] = name
        event["_folder_uid"] = folder_uid
        event["_trusted"] = event["_uid"] in trusted_uids and str(event.get("job_id")) == folder.name
        yield event


_NAME_NS = re.compile(r"([0-9]{1,20})-")


def _order(name: str, event: dict) -> int:
    """Nanoseconds since the epoch: the file name's when they fall in the second its content says
    (the text has whole seconds), else the content's second, else 0 (sorts first)."""
    try:
        moment = from_text(str(event.get("time", "")))
        second = int(moment.timestamp())
    except (ValueError, OverflowError, OSError):
        return 0
    head = _NAME_NS.match(name)
    if head and second <= int(head.group(1)) // 1_000_000_000 <= second + 1:
        return int(head.group(1))
    return second * 1_000_000_000


def _read_one(path: Path) -> dict | None:
    try:
        # O_NOFOLLOW: an event file that is a symlink is not an event; O_NONBLOCK: nor is a FIFO.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_EVENT_BYTES:
            return None
        try:
            event = json.loads(handle.read(MAX_EVENT_BYTES + 1))
        except (OSError, ValueError, RecursionError):  # RecursionError: [[[[... nested 100,000 deep
            return None
    if not isinstance(event, dict) or event.get("kind") not in KINDS:
        return None
    event["_uid"] = info.st_uid
    return event


def job_ids(state_dir: Path | str) -> list[str]:
    """Every job with a ledger folder."""
    try:
        names = os.listdir(Path(state_dir) / "jobs")
    except OSError:
        return []
    return sorted((n for n in names if ids.is_job_name(n)), key=lambda j: (len(j), j))
