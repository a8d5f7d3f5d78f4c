"""What the watcher has already done, kept on disk so a restarted watcher neither repeats nor forgets.

One small JSON file, replaced atomically after every change (``durable.write_atomic``)::

    {"version": 1,
     "events": {"pre1": {"drain_time": "...Z", "reason": "...", "source": "slurm", "grace": 300,
                        "handled": true, "enforced": false}},
     "told":   {"123|pre1": {"event_id": "pre1@...Z", "notice": "...Z", "signal": "...Z"}},
     "restarts": {"123": {"fast_restart": 1, "fallback": "standard"}}}

Why "told" is keyed by job and node, not by the event id Slurm would suggest: after DRAIN then DOWN,
Slurm overwrites the drain reason and its time with the DOWN ones, so the "same" event would get a new
id. The first drain time seen for a node is kept in ``events`` until the node is seen back in service;
only then is the node forgotten, so a later drain of it is a new event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from slurm_preempt.durable import write_atomic
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS, from_text, to_text

VERSION = 1


@dataclass
class NodeEvent:
    """The drain event a node is in, as first seen."""

    node: str
    drain_time: datetime
    reason: str
    source: str
    grace: float
    handled: bool = False  # every job on the node was told (a failed query or signal is retried)
    enforced: bool = False

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
        )


@dataclass
class SentState:
    """In memory, with ``save()`` writing it back when a ``path`` is set (None: memory only)."""

    path: Path | None = None
    events: dict[str, NodeEvent] = field(default_factory=dict)
    told: dict[str, dict] = field(default_factory=dict)
    restarts: dict[str, dict] = field(default_factory=dict)

    # ----------------------------------------------------------------------------------- told

    @staticmethod
    def key(job_id: str, node: str) -> str:
        return f"{job_id}|{node}"

    def done(self, job_id: str, node: str, what: str) -> bool:
        return what in self.told.get(self.key(job_id, node), {})

    def mark(self, job_id: str, node: str, what: str, moment: datetime, event_id: str) -> None:
        entry = self.told.setdefault(self.key(job_id, node), {"event_id": event_id})
        entry[what] = to_text(moment)

    def forget_node(self, node: str) -> None:
        """The node is back in service: its event is over, a later drain is a new one."""
        self.events.pop(node, None)
        suffix = f"|{node}"
        for key in [k for k in self.told if k.endswith(suffix)]:
            del self.told[key]

    def forget_jobs(self, keep: set[str]) -> None:
        """Drop restart records of jobs no longer in the queue."""
        for job_id in [j for j in self.restarts if j not in keep]:
            del self.restarts[job_id]

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
    """The state saved at ``path``; an empty one when there is none. A corrupt file raises ValueError."""
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
    state.told = {k: dict(v) for k, v in data.get("told", {}).items()}
    state.restarts = {k: dict(v) for k, v in data.get("restarts", {}).items()}
    return state
