"""What the watcher has already done, kept on disk so a restarted (or standby) watcher neither repeats
nor forgets.

One small JSON file, replaced atomically (``durable.write_atomic``) after every change::

    {"version": 2,
     "events": {"pre1": {"drain_time": "...Z", "reason": "...", "source": "slurm", "grace": 300,
                        "handled": true, "enforced": false}},
     "told":   {"123|pre1": {"event_id": "pre1@...Z", "attempt": 0, "deadline": "...Z",
                            "notice": "...Z", "signal": "...Z", "enforced": "...Z"}},
     "restarts": {"123": {"fast_restart": 1, "fallback": "standard"}}}

Why "told" is keyed by job and node, not by the event id Slurm would suggest: after DRAIN then DOWN,
Slurm overwrites the drain reason and its time with the DOWN ones, so the "same" event would get a new
id. The first drain time seen for a node is kept in ``events`` until the node is seen back in service;
only then is the node forgotten, so a later drain of it is a new event. ``attempt`` is the job's restart
count when it was told: a job is told once per attempt while any event it was told of is open, and a
drain of another of its nodes in that attempt never postpones its deadline.

Everything here is bounded by what is open now (events of drained nodes, the jobs that were on them,
requeued jobs still pending): nothing grows with the number of polls or with time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_preempt.durable import write_atomic
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS, from_text, to_text

VERSION = 2
ACTS = ("notice", "signal", "enforced")


@dataclass
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
            drain_time=from_text(data["drain_time"]),
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


@dataclass
class SentState:
    """In memory, with ``save()`` writing it back when a ``path`` is set (None: memory only)."""

    path: Path | None = None
    events: dict[str, NodeEvent] = field(default_factory=dict)
    told: dict[str, dict] = field(default_factory=dict)
    restarts: dict[str, dict] = field(default_factory=dict)
    _nodes_of: dict[str, set[str]] = field(default_factory=dict, repr=False)  # job -> nodes in ``told``

    def __post_init__(self) -> None:
        self._reindex()

    # ----------------------------------------------------------------------------------- told

    @staticmethod
    def key(job_id: str, node: str) -> str:
        return f"{job_id}|{node}"

    def done(self, job_id: str, node: str, what: str) -> bool:
        return what in self.told.get(self.key(job_id, node), {})

    def mark(
        self,
        job_id: str,
        node: str,
        what: str,
        moment: datetime,
        event_id: str,
        attempt: int | None = None,
        deadline: datetime | None = None,
    ) -> None:
        entry = self.told.setdefault(self.key(job_id, node), {"event_id": event_id})
        if attempt is not None:
            entry.setdefault("attempt", attempt)
        if deadline is not None:
            entry.setdefault("deadline", to_text(deadline))
        entry[what] = to_text(moment)
        self._nodes_of.setdefault(job_id, set()).add(node)

    def nodes_told(self, job_id: str) -> set[str]:
        return set(self._nodes_of.get(job_id, ()))

    def telling(self, job_id: str, attempt: int) -> Telling | None:
        """The earliest deadline this job was told in ``attempt``, while that event is still open."""
        found = []
        for node in self._nodes_of.get(job_id, ()):
            entry = self.told[self.key(job_id, node)]
            told = "notice" in entry or "signal" in entry
            if not told or "deadline" not in entry:
                continue
            if entry.get("attempt", attempt) == attempt and node in self.events:
                found.append(Telling(entry["event_id"], from_text(entry["deadline"])))
        return min(found, key=lambda t: t.deadline) if found else None

    def forget_node(self, node: str) -> None:
        """The node is back in service: its event is over, a later drain is a new one."""
        self.events.pop(node, None)
        for job_id in [j for j, nodes in self._nodes_of.items() if node in nodes]:
            self.told.pop(self.key(job_id, node), None)
            self._nodes_of[job_id].discard(node)
            if not self._nodes_of[job_id]:
                del self._nodes_of[job_id]

    def forget_jobs(self, keep: set[str]) -> None:
        """Drop restart records of jobs no longer in the queue."""
        for job_id in [j for j in self.restarts if j not in keep]:
            del self.restarts[job_id]

    def _reindex(self) -> None:
        self._nodes_of = {}
        for key in self.told:
            job_id, _, node = key.partition("|")
            self._nodes_of.setdefault(job_id, set()).add(node)

    # ----------------------------------------------------------------------------------- disk

    def to_json(self) -> dict:
        return {
            "version": VERSION,
            "events": {name: ev.to_json() for name, ev in self.events.items()},
            "told": self.told,
            "restarts": self.restarts,
        }

    def save(self) -> None:
        """Write atomically. Raises OSError; the caller logs it and carries on in memory."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(self.to_json()), 0o600)


def load(path: Path | None) -> SentState:
    """The state saved at ``path``; an empty one when there is none. A corrupt file raises ValueError.
    Version 1 files (no attempt, no deadline per job) load too: such entries match any attempt."""
    state = SentState(path=path)
    if path is None or not path.exists():
        return state
    data = json.loads(path.read_text())
    # Any other shape (a list, "events": 3, an entry that is a string) is a corrupt file: ValueError,
    # which the watcher answers by moving it aside, never by failing to start on every restart.
    shape_ok = isinstance(data, dict) and all(
        isinstance(data.get(key, {}), dict) and all(isinstance(v, dict) for v in data.get(key, {}).values())
        for key in ("events", "told", "restarts")
    )
    if not shape_ok:
        raise ValueError(f"{path} does not hold a watcher state")
    try:
        state.events = {n: NodeEvent.from_json(n, e) for n, e in data.get("events", {}).items()}
        for event in state.events.values():
            to_text(event.drain_time)  # a time that cannot be made UTC (year 10000) fails here, not later
    except (KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise ValueError(f"{path}: an event is not a watcher event ({exc})") from None
    state.told = {k: dict(v) for k, v in data.get("told", {}).items() if "|" in k}
    state.restarts = {k: dict(v) for k, v in data.get("restarts", {}).items()}
    state._reindex()
    return state
