"""What the watcher has already done, kept on disk so a restarted (or standby) watcher neither repeats
nor forgets.

One small JSON file, replaced atomically (``durable.write_atomic``) whenever it changed::

    {"version": 2,
     "events": {"pre1": {"drain_time": "...Z", "reason": "...", "source": "slurm", "grace": 300,
                        "handled": true, "enforced": false}},
     "told":   {"123|pre1": {"event_id": "pre1@...Z", "attempt": 0, "deadline": "...Z",
                            "notice": "...Z", "signal": "...Z", "enforced": "...Z"}},
     "restarts": {"123": {"fast_restart": 1, "fallback": "standard", "launch_held": 1,
                          "launch_moved": 1}},
     "released": {"123": "...Z"}}

``released``: jobs the watcher released from a failed-launch hold, and when. The watcher releases a job
once; this is where it remembers that, because the ledger folder where it also says so is the job
owner's, who may delete the event there. Kept ``RELEASED_DAYS`` after the release (a job that sits
held longer is released once more), so it stays as small as the number of such releases in that
time. Files without it load (nothing released); older watchers ignore it.

Why "told" is keyed by job and node, not by the event id Slurm would suggest: after DRAIN then DOWN,
Slurm overwrites the drain reason and its time with the DOWN ones, so the "same" event would get a new
id. The first drain time seen for a node is kept in ``events`` until the node is seen back in service;
only then is the node forgotten, so a later drain of it is a new event. ``attempt`` is the job's restart
count when it was told: a job is told once per attempt while any event it was told of is open, and a
drain of another of its nodes in that attempt never postpones its deadline. Version 1 files (no
``attempt``, no ``deadline``) load too: such entries match any attempt; they are written back as
version 2, entries unchanged.

The records are frozen: only ``SentState``'s methods change them, each saying what happened
(``mark_told``, ``record_fallback``, ...), and each marks the state changed, so ``changed`` says
whether there is anything to write. Nothing else keeps a flag for it.

Everything here is bounded by what is open now (events of drained nodes, the jobs that were on them,
requeued jobs still pending, releases of the last ``RELEASED_DAYS``): nothing grows with the number
of polls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurm_preempt.durable import write_atomic
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS, from_text, to_text

VERSION = 2
RELEASED_DAYS = 30  # how long a release from a failed-launch hold is remembered
ACTS = ("notice", "signal", "enforced")


@dataclass(frozen=True)
class NodeEvent:
    """The drain event a node is in, as first seen."""

    node: str
    drain_time: datetime
    reason: str
    source: str
    grace: float
    handled: bool = False  # every job on the node was told (a failed query or signal is retried)
    enforced: bool = False  # every opted-in job still on it at deadline - margin was requeued
    seen: bool = field(default=True, compare=False)  # seen going away by this process (not saved)

    def to_json(self) -> dict:
        return {
            "drain_time": to_text(self.drain_time),
            "reason": self.reason,
            "source": self.source,
            "grace": self.grace,
            "handled": self.handled,
            "enforced": self.enforced,
        }

    @classmethod
    def from_json(cls, node: str, data: dict) -> NodeEvent:
        return cls(
            node=node,
            drain_time=_time(data["drain_time"]),
            reason=str(data.get("reason", "")),
            source=str(data.get("source", "slurm")),
            grace=float(data.get("grace", DEFAULT_GRACE_SECONDS)),
            handled=bool(data.get("handled", False)),
            enforced=bool(data.get("enforced", False)),
            seen=False,  # loaded: left open by an earlier run
        )


@dataclass(frozen=True)
class Telling:
    """What a job was told in its current attempt: the event and its deadline."""

    event_id: str
    deadline: datetime


@dataclass(frozen=True)
class Told:
    """What one job was told of one node's event, and when each act (``ACTS``) was done."""

    event_id: str
    attempt: int | None = None  # the job's restart count when told; None (version 1): any attempt
    deadline: datetime | None = None
    notice: datetime | None = None
    signal: datetime | None = None
    enforced: datetime | None = None

    def done(self, what: str) -> bool:
        return getattr(self, _act(what)) is not None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"event_id": self.event_id}
        if self.attempt is not None:
            out["attempt"] = self.attempt
        for name in ("deadline", *ACTS):
            moment = getattr(self, name)
            if moment is not None:
                out[name] = to_text(moment)
        return out

    @classmethod
    def from_json(cls, data: dict) -> Told:
        attempt = data.get("attempt")
        if not isinstance(data.get("event_id"), str) or not (attempt is None or _whole(attempt)):
            raise ValueError(f"a told entry is not one: {data!r:.80}")
        moments = {name: _time(data[name]) for name in ("deadline", *ACTS) if name in data}
        return cls(data["event_id"], attempt, **moments)


@dataclass(frozen=True)
class Restarts:
    """What the watcher did about one pending job, each by the attempt (restart count) it was done in."""

    fast_restart: int | None = None  # its fast restart is recorded (the start time is still sent)
    fallback: str | None = None  # the constraint it was moved to
    launch_held: int | None = None  # its failed-launch hold was dealt with
    launch_moved: int | None = None  # after that failed launch it was moved and released

    def to_json(self) -> dict:
        return {name: value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_json(cls, data: dict) -> Restarts:
        found = {f.name: data[f.name] for f in fields(cls) if data.get(f.name) is not None}
        fallback = found.get("fallback")
        counts_ok = all(_whole(v) for k, v in found.items() if k != "fallback")
        if not counts_ok or not (fallback is None or isinstance(fallback, str)):
            raise ValueError(f"a restart record is not one: {data!r:.80}")
        return cls(**found)


NO_RESTARTS = Restarts()


class SentState:
    """In memory, with ``save()`` writing it back when a ``path`` is set (None: memory only). Read it
    through ``events``, ``told`` and ``restarts`` (read-only views) and the questions below; change it
    only through the methods that say what happened."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._events: dict[str, NodeEvent] = {}
        self._told: dict[tuple[str, str], Told] = {}
        self._restarts: dict[str, Restarts] = {}
        self._released: dict[str, datetime] = {}
        self._nodes_of: dict[str, set[str]] = {}  # job -> its nodes in ``_told``
        self._changed = False

    def __repr__(self) -> str:
        sizes = f"{len(self._events)} events, {len(self._told)} told, {len(self._restarts)} restarts"
        return f"SentState({self.path}: {sizes})"

    @property
    def events(self) -> Mapping[str, NodeEvent]:
        return MappingProxyType(self._events)

    @property
    def told(self) -> Mapping[tuple[str, str], Told]:
        return MappingProxyType(self._told)

    @property
    def restarts(self) -> Mapping[str, Restarts]:
        return MappingProxyType(self._restarts)

    @property
    def changed(self) -> bool:
        """Something to write: a change since the last save, or no file yet (written once at start: it
        shows the watcher runs and can save)."""
        return self._changed or (self.path is not None and not self.path.exists())

    # ----------------------------------------------------------------------------------- events

    def open_event(self, event: NodeEvent) -> None:
        """A node newly going away."""
        self._put_event(event)

    def saw(self, node: str) -> None:
        """This process saw the node's event open (not saved: it only decides what is logged)."""
        event = self._events.get(node)
        if event is not None and not event.seen:
            self._events[node] = replace(event, seen=True)

    def set_handled(self, node: str, handled: bool) -> None:
        """Every job on the node was told (True), or something must be asked and told again (False)."""
        event = self._events.get(node)
        if event is not None and event.handled != handled:
            self._put_event(replace(event, handled=handled))

    def set_enforced(self, node: str, enforced: bool) -> None:
        """Every opted-in job still on the node near its deadline was requeued (or none is left)."""
        event = self._events.get(node)
        if event is not None and event.enforced != enforced:
            self._put_event(replace(event, enforced=enforced))

    def forget_node(self, node: str) -> None:
        """The node is back in service: its event is over, a later drain is a new one."""
        if self._events.pop(node, None) is not None:
            self._changed = True
        for job_id in [j for j, nodes in self._nodes_of.items() if node in nodes]:
            del self._told[(job_id, node)]
            self._nodes_of[job_id].discard(node)
            if not self._nodes_of[job_id]:
                del self._nodes_of[job_id]
            self._changed = True

    def _put_event(self, event: NodeEvent) -> None:
        self._events[event.node] = event
        self._changed = True

    # ----------------------------------------------------------------------------------- told

    def done(self, job_id: str, node: str, what: str) -> bool:
        told = self._told.get((job_id, node))
        return told is not None and told.done(what)

    def mark_told(
        self,
        job_id: str,
        node: str,
        what: str,
        moment: datetime,
        event_id: str,
        attempt: int | None = None,
        deadline: datetime | None = None,
    ) -> None:
        """``what`` (an act of ``ACTS``) was done for the job on ``node`` at ``moment``. The first event,
        attempt and deadline recorded for the pair stay."""
        _act(what)
        told = self._told.get((job_id, node)) or Told(event_id)
        notice, signal, enforced = (moment if name == what else getattr(told, name) for name in ACTS)
        self._told[(job_id, node)] = Told(
            told.event_id,
            attempt if told.attempt is None else told.attempt,
            deadline if told.deadline is None else told.deadline,
            notice,
            signal,
            enforced,
        )
        self._nodes_of.setdefault(job_id, set()).add(node)
        self._changed = True

    def nodes_told(self, job_id: str) -> set[str]:
        return set(self._nodes_of.get(job_id, ()))

    def telling(self, job_id: str, attempt: int, holding: Iterable[str] | None = None) -> Telling | None:
        """The earliest deadline this job was told in ``attempt``, while that event is still open and,
        given ``holding`` (the job's nodes now), the job still holds its node: a job that shrank away
        from the node it was told of (job/shrink.py) is told again when one of the others drains."""
        found = []
        kept = None if holding is None else set(holding)
        for node in self._nodes_of.get(job_id, ()):
            if kept is not None and node not in kept:
                continue
            told = self._told[(job_id, node)]
            if (told.notice is None and told.signal is None) or told.deadline is None:
                continue
            if told.attempt in (None, attempt) and node in self._events:
                found.append(Telling(told.event_id, told.deadline))
        return min(found, key=lambda t: t.deadline) if found else None

    # ----------------------------------------------------------------------------------- restarts

    def restarts_of(self, job_id: str) -> Restarts:
        return self._restarts.get(job_id, NO_RESTARTS)

    def record_fallback(self, job_id: str, constraint: str) -> None:
        """The pending job was moved to ``constraint`` (standard nodes)."""
        self._update_restarts(job_id, fallback=constraint)

    def record_fast_restart(self, job_id: str, restart_count: int) -> None:
        """The requeued job's start time was set to now, in attempt ``restart_count``."""
        self._update_restarts(job_id, fast_restart=restart_count)

    def record_launch_held(self, job_id: str, restart_count: int) -> None:
        """The hold of this failed launch is dealt with (released, or left to an operator)."""
        self._update_restarts(job_id, launch_held=restart_count)

    def record_launch_moved(self, job_id: str, restart_count: int) -> None:
        """After this failed launch the job was moved to other nodes and released."""
        self._update_restarts(job_id, launch_moved=restart_count)

    def record_released(self, job_id: str, now: datetime) -> None:
        """Released from a failed-launch hold (before the release is asked: never twice)."""
        self._released[job_id] = now
        self._changed = True

    def take_back_released(self, job_id: str) -> None:
        """The release was refused: nothing to remember."""
        if self._released.pop(job_id, None) is not None:
            self._changed = True

    def released(self, job_id: str) -> bool:
        return job_id in self._released

    def forget_released(self, now: datetime) -> None:
        """Drop releases older than ``RELEASED_DAYS``."""
        old = [j for j, when in self._released.items() if (now - when).days >= RELEASED_DAYS]
        for job_id in old:
            del self._released[job_id]
            self._changed = True

    def forget_jobs(self, keep: set[str]) -> None:
        """Drop restart records of jobs no longer in the queue."""
        for job_id in [j for j in self._restarts if j not in keep]:
            del self._restarts[job_id]
            self._changed = True

    def _update_restarts(self, job_id: str, **values: Any) -> None:
        record = self.restarts_of(job_id)
        updated = replace(record, **values)
        if updated != record or job_id not in self._restarts:
            self._restarts[job_id] = updated
            self._changed = True

    # ----------------------------------------------------------------------------------- disk

    def to_json(self) -> dict:
        data = {
            "version": VERSION,
            "events": {name: event.to_json() for name, event in self._events.items()},
            "told": {f"{job}|{node}": told.to_json() for (job, node), told in self._told.items()},
            "restarts": {job: record.to_json() for job, record in self._restarts.items()},
        }
        if self._released:  # only then: a file without releases reads as any version 2 file did
            data["released"] = {job: to_text(when) for job, when in self._released.items()}
        return data

    def save(self) -> None:
        """Write atomically. Raises OSError (the state stays changed); the caller logs it and carries
        on in memory."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self.to_json()), 0o600)
        self._changed = False

    @classmethod
    def from_json(cls, data: Any, path: Path | None = None) -> SentState:
        """The state a file holds (version 1 or 2). Any other shape (a list, "events": 3, an entry
        that is a string, a time that is none) raises ValueError: a corrupt file, which the watcher
        answers by moving it aside, never by failing to start on every restart."""
        shape_ok = isinstance(data, dict) and all(
            isinstance(part, dict) and all(isinstance(v, dict) for v in part.values())
            for part in (data.get(key, {}) for key in ("events", "told", "restarts"))
        )
        if not shape_ok:
            raise ValueError(f"{path or 'the file'} does not hold a watcher state")
        state = cls(path)
        try:
            state._events = {n: NodeEvent.from_json(n, e) for n, e in data.get("events", {}).items()}
            for key, entry in data.get("told", {}).items():
                job_id, bar, node = key.partition("|")
                if bar:
                    state._told[(job_id, node)] = Told.from_json(entry)
                    state._nodes_of.setdefault(job_id, set()).add(node)
            state._restarts = {j: Restarts.from_json(r) for j, r in data.get("restarts", {}).items()}
            released = data.get("released", {})
            if not isinstance(released, dict):
                raise TypeError("released is not a map")
            state._released = {str(j): _time(when) for j, when in released.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path or 'the file'}: not a watcher state ({exc})") from None
        return state


def load(path: Path | None) -> SentState:
    """The state saved at ``path``; an empty one when there is none. A corrupt file raises ValueError."""
    if path is None or not path.exists():
        return SentState(path=path)
    return SentState.from_json(json.loads(path.read_text()), path)


def _act(what: str) -> str:
    if what not in ACTS:
        raise ValueError(f"not an act of the watcher: {what!r}")
    return what


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _time(text: Any) -> datetime:
    """A saved moment; one that cannot be read, or not made UTC again (year 10000), is a ValueError
    here rather than later in a poll."""
    if not isinstance(text, str):
        raise ValueError(f"not a time: {text!r:.40}")
    try:
        moment = from_text(text)
        to_text(moment)
    except OverflowError:
        raise ValueError(f"not a time: {text!r:.40}") from None
    return moment
