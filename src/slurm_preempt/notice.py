"""The preemption notice: what a job is told when its node is going away.

The contract (README "How it works", docs/watcher.md): when a source learns that node N will be taken
away at deadline D, every job on N gets a JSON file, written atomically where the job reads it
(``SLURM_PREEMPT_NOTICE``, by default ``<state_dir>/notices/<job_id>.json``)::

    {"version": 1, "job_id": "123", "node": "pre1", "reason": "...", "source": "slurm",
     "event_id": "pre1@2026-12-01T06:06:41Z", "drain_time": "...Z", "detected_at": "...Z",
     "deadline": "...Z", "grace_seconds": 300, "restart_count": 0}

All times are UTC ISO 8601. The deadline is the drain time Slurm (or the provider) recorded plus the
grace, never the time the watcher happened to look. ``event_id`` names one drain event: a job is told
once per event. ``restart_count`` (optional) is the job's restart count that Slurm reported when the
notice was written: the attempt it is for, so a later attempt knows it is not for it without comparing
clocks. Import-light: the job-side library reads notices with nothing but the standard library.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurm_preempt import ids
from slurm_preempt.durable import write_atomic
from slurm_preempt.trust import read_small, writer_uids

VERSION = 1
ENV_NOTICE = "SLURM_PREEMPT_NOTICE"  # where a job reads its notice (the TaskProlog exports it)
DEFAULT_GRACE_SECONDS = 300.0  # the providers' window from drain to removal: the default grace
# The source of a notice that tells a job below its MAX nodes to requeue and come back larger
# (watch/growback.py): no node is leaving, so a job never shrinks on it (job/shrink.py).
GROW_BACK_SOURCE = "grow-back"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def to_text(moment: datetime, timespec: str = "seconds") -> str:
    """``2026-12-01T06:00:00Z``; ``timespec="milliseconds"`` for records that time phases of a second."""
    return moment.astimezone(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def from_text(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def deadline(drain_time: datetime, grace_seconds: float) -> datetime:
    """When a node drained at ``drain_time`` is taken away: the one place a deadline is computed.

    A job that got a bare signal (no notice file) uses it too, with the signal's time and its
    ``deadline_after_signal`` (``job/settings.py``)."""
    return drain_time + timedelta(seconds=grace_seconds)


@dataclass(frozen=True)
class Notice:
    job_id: str
    node: str
    reason: str
    source: str
    drain_time: datetime
    detected_at: datetime
    deadline: datetime
    event_id: str = ""
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    version: int = VERSION
    restart_count: int | None = None  # the job's restart count when told: names the attempt it is for

    @classmethod
    def for_drain(
        cls,
        job_id: str,
        node: str,
        reason: str,
        source: str,
        drain_time: datetime,
        grace_seconds: float,
        detected_at: datetime | None = None,
        restart_count: int | None = None,
    ) -> Notice:
        """A notice whose deadline is ``drain_time + grace`` (the truth, however late we look)."""
        return cls(
            job_id=str(job_id),
            node=node,
            reason=reason,
            source=source,
            drain_time=drain_time,
            detected_at=detected_at or utcnow(),
            deadline=deadline(drain_time, grace_seconds),
            event_id=event_id(node, drain_time),
            grace_seconds=grace_seconds,
            restart_count=restart_count,
        )

    def seconds_left(self, now: datetime | None = None) -> float:
        return (self.deadline - (now or utcnow())).total_seconds()

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("drain_time", "detected_at", "deadline"):
            data[key] = to_text(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict) -> Notice:
        return cls(
            job_id=str(data["job_id"]),
            node=str(data.get("node", "")),
            reason=str(data.get("reason", "")),
            source=str(data.get("source", "")),
            drain_time=from_text(data.get("drain_time") or data["deadline"]),
            detected_at=from_text(data.get("detected_at") or data["deadline"]),
            deadline=from_text(data["deadline"]),
            event_id=str(data.get("event_id", "")),
            grace_seconds=float(data.get("grace_seconds", DEFAULT_GRACE_SECONDS)),
            version=int(data.get("version", VERSION)),
            restart_count=_count(data.get("restart_count")),
        )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def event_id(node: str, drain_time: datetime) -> str:
    return f"{node}@{to_text(drain_time)}"


def notice_path(state_dir: Path | str, job_id: str) -> Path:
    """``<state_dir>/notices/<job_id>.json``; ValueError unless ``job_id`` is a job id (finding 2: a
    forged ``../../..`` once made a folder outside the state folder)."""
    return Path(state_dir) / "notices" / f"{ids.job_id(str(job_id))}.json"


def write_notice(path: Path | str, notice: Notice, mode: int = 0o644) -> Path:
    """Write atomically and durably: a reader sees the whole notice or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(notice.to_json()), mode)


MAX_NOTICE_BYTES = 64 * 1024


def read_notice(path: Path | str, owners: Collection[int] | None = None) -> Notice | None:
    """The notice at ``path``, or None when there is none (or it is not a valid notice).

    Read like an event (``trust.read_small``): never through a link, never blocking on a FIFO, at most
    ``MAX_NOTICE_BYTES``, and only a file of ``owners``: by default root, the listed writers of the
    state folder the path is in (``<state>/notices/<job>.json``), and this process's user (a job reads
    what its own sidecar wrote; a watcher what it wrote itself)."""
    path = Path(path)
    if owners is None:
        owners = writer_uids(path.parent.parent) | {os.geteuid()}
    try:
        return Notice.from_json(json.loads(read_small(path, MAX_NOTICE_BYTES, owners)))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
