"""The restart ledger: one small JSON file per event, under a per-job folder of the state directory.

Layout::

    <state_dir>/jobs/<job_id>/<time_ns>-<host>-<pid>-<kind>.json

Each file is written with ``durable.write_atomic``, so a reader never sees half an event, and no two
hosts ever append to one file (the state directory is usually NFS). Kinds:

    attempt_start  attempt_end  notice_sent  signal_sent  checkpoint_saved  resumed_from
    requeued  fast_restart  fallback  enforced_requeue  launch_held  shrunk  grow_back

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
links, FIFOs, huge files, renamed root files, and floods of them: a folder past ``MAX_ENTRIES`` names
or ``MAX_FOLDER_BYTES`` of events is not read at all (``LedgerUnreadable``, logged once), and the
watcher's own checks (``find``) open only names of one kind from the owners it believes. The order
and time of an event come from its content (root's files cannot be edited by the folder's owner, only
renamed); the nanoseconds in a file's name are used only when they agree with the time inside it, so
renaming a root file moves nothing.
Import-light: standard library only.
"""

from __future__ import annotations

import json
import logging
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
from slurm_preempt.trust import read_small, writer_uids

log = logging.getLogger(__name__)

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
    "checkpoint_interval",
    "progress",
    "resumed_from",
    "requeued",
    "fast_restart",
    "fallback",
    "enforced_requeue",
    "launch_held",
    "shrunk",
    "grow_back",
)


MAX_EVENT_BYTES = 64 * 1024
# Bounds of one job folder, which its owner may fill at will: past them the folder is not read (one
# log line) instead of holding root's reader for seconds and gigabytes. A job that checkpoints every
# ten minutes for four months writes ~17,000 small events, far below the byte bound.
MAX_ENTRIES = 20_000
MAX_FOLDER_BYTES = 16 * 1024 * 1024
MAX_FIND_BYTES = 1024 * 1024  # of one kind, for the watcher's own checks (``find``), which must be quick


def job_dir(state_dir: Path | str, job_id: str) -> Path:
    """``<state_dir>/jobs/<job_id>``; ValueError unless ``job_id`` is a job id (never ``..``, ``²``)."""
    return Path(state_dir) / "jobs" / ids.job_id(str(job_id))


def record(state_dir: Path | str, job_id: str, kind: str, source: str, **fields) -> Path:
    """Write one event; return its path. Raises OSError when the state folder is not writable."""
    if kind not in KINDS:
        raise ValueError(f"unknown ledger event kind {kind!r}")
    folder = job_dir(state_dir, job_id)
    # 0700: a folder made here first (the watcher's event for a job that has not started) is no one
    # else's to read; the prolog hands it to the job's user.
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    """All readable events of a job, oldest first (by the time in the file name, then name).
    Raises ``LedgerUnreadable`` when the folder is past the bounds (``MAX_ENTRIES``, ``MAX_FOLDER_BYTES``)."""
    folder = job_dir(state_dir, job_id)
    return sorted(_read_all(folder), key=lambda e: (e["_order"], e.get("_file", "")))


def trusted_events(state_dir: Path | str, job_id: str) -> list[dict]:
    """The events a report may believe: root's of every kind, the job owner's only of job kinds, and
    only when the folder is the job's user's (the uid root's ``attempt_start`` names): a folder of an
    earlier job with this id, of another user, speaks for none of this job."""
    found = events(state_dir, job_id)
    users = {str(e["uid"]) for e in found if e["_trusted"] and e["kind"] == "attempt_start" and e.get("uid")}
    for event in found:
        event["_folder_is_users"] = not users or str(event["_folder_uid"]) in users
    return [e for e in found if believed(e)]


def believed(event: dict) -> bool:
    """Root's (or a listed writer's) event, or one of a job kind from the owner of the job's folder
    (when that folder is the job's user's, as far as root's records say)."""
    if event["_trusted"]:
        return True
    owners = event["_uid"] == event["_folder_uid"] and event.get("_folder_is_users", True)
    return event["kind"] not in ROOT_KINDS and owners


def written_by(event: dict) -> str:
    """Who wrote ``event``, from its file's owner: ``root``, ``writer`` (a uid of ``<state>/writers``),
    ``owner`` (the job folder's owner), or ``other``."""
    if event["_uid"] == 0:
        return "root"
    if event["_writer"]:
        return "writer"
    owners = event["_uid"] == event["_folder_uid"] and event.get("_folder_is_users", True)
    return "owner" if owners else "other"


def find(
    state_dir: Path | str, job_id: str, kind: str, owner: int | None = None, **match: object
) -> Path | None:
    """The event file of ``kind`` whose fields equal ``match``; None if none.

    For the watcher's own checks (recorded before acting): only names of that kind are looked at, and
    only files of root, a listed writer, this process's user, and ``owner`` (the job's user, a sidecar
    watcher) when the folder is theirs are opened, so whatever else a user keeps in their folder costs
    a directory listing (bounded by ``MAX_ENTRIES``) and nothing more, and what the job's user writes
    under that kind's name at most ``MAX_FIND_BYTES`` parsed. Raises ``LedgerUnreadable``."""
    folder = job_dir(state_dir, job_id)
    try:
        fd = _open_folder(folder)
    except FileNotFoundError:
        return None
    try:
        uids = writer_uids(state_dir) | {os.geteuid()}
        if owner is not None and os.fstat(fd).st_uid == owner:
            uids |= {owner}
        found = [(name, info) for name, info in _entries(fd, folder, f"-{kind}.json") if info.st_uid in uids]
        total = sum(info.st_size for _name, info in found)
        if total > MAX_FIND_BYTES:  # the owner's own files of that kind, padded: a sidecar writes ~300 B
            raise _unreadable(folder, f"{total} bytes of {kind} events, more than {MAX_FIND_BYTES}")
        for name, info in found:
            event = _read_one(name, fd, info.st_uid)
            if event and event["kind"] == kind and all(event.get(k) == v for k, v in match.items()):
                return folder / name
    finally:
        os.close(fd)
    return None


def _read_all(folder: Path) -> Iterator[dict]:
    try:
        fd = _open_folder(folder)
    except OSError:
        return
    try:
        folder_uid = os.fstat(fd).st_uid
        found = _entries(fd, folder, ".json")
        total = sum(info.st_size for _name, info in found)
        if total > MAX_FOLDER_BYTES:
            raise _unreadable(folder, f"{total} bytes of events, more than {MAX_FOLDER_BYTES}")
        writers = writer_uids(folder.parent.parent)
        for name, info in found:
            event = _read_one(name, fd, info.st_uid)
            if event is None:
                continue
            event["_order"] = _order(name, event)
            event["_file"] = name
            event["_folder_uid"] = folder_uid
            event["_writer"] = event["_uid"] in writers
            event["_trusted"] = event["_writer"] and str(event.get("job_id")) == folder.name
            yield event
    finally:
        os.close(fd)


class LedgerUnreadable(OSError):
    """A job folder past the bounds (too many entries, too many bytes of events): not read at all.
    An OSError, so every reader that copes with a folder it cannot list copes with this one."""


_logged: set[str] = set()  # folders already said to be unreadable (once per folder and process)


def _unreadable(folder: Path, why: str) -> LedgerUnreadable:
    if str(folder) not in _logged and len(_logged) < 100_000:
        _logged.add(str(folder))
        log.warning("ledger of job %s not read: %s (treated as unreadable)", folder.name, why)
    return LedgerUnreadable(f"ledger of job {folder.name} not read: {why}")


def _open_folder(folder: Path) -> int:
    # O_NOFOLLOW: jobs/ is root's, so no user can put a link there; should one appear, it is no ledger.
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _entries(fd: int, folder: Path, suffix: str) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of the regular files ending in ``suffix`` of at most ``MAX_EVENT_BYTES``; every
    name counts toward ``MAX_ENTRIES`` (listing stops there: the folder is then unreadable)."""
    found = []
    with os.scandir(fd) as listing:
        for count, entry in enumerate(listing, 1):
            if count > MAX_ENTRIES:
                raise _unreadable(folder, f"more than {MAX_ENTRIES} entries")
            if entry.name.startswith(".") or not entry.name.endswith(suffix):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_EVENT_BYTES:
                found.append((entry.name, info))
    return found


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


def _read_one(name: str, folder: int, uid: int) -> dict | None:
    """The event in file ``name`` of the open ``folder``; ``uid``: its owner as listed (a file swapped
    since, by a user racing the reader, is another owner's and not read)."""
    try:
        # Not through a link, never blocking on a FIFO, at most MAX_EVENT_BYTES.
        event = json.loads(read_small(name, MAX_EVENT_BYTES, {uid}, dir_fd=folder))
    except (OSError, ValueError, RecursionError):  # RecursionError: [[[[... nested 100,000 deep
        return None
    if not isinstance(event, dict) or event.get("kind") not in KINDS:
        return None
    # Every field we write is a scalar: lists and objects (a user's padding) are not kept.
    event = {k: v for k, v in event.items() if not isinstance(v, (list, dict))}
    event["_uid"] = uid
    return event


def job_ids(state_dir: Path | str) -> list[str]:
    """Every job with a ledger folder."""
    try:
        names = os.listdir(Path(state_dir) / "jobs")
    except OSError:
        return []
    return sorted((n for n in names if ids.is_job_name(n)), key=lambda j: (len(j), j))
