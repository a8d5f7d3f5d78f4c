"""Azure Scheduled Events (instance metadata): a Spot VM's eviction as a ``Preempt`` event.

``GET <base>/metadata/scheduledevents?api-version=2020-07-01`` with the header ``Metadata: true``
answers ``{"DocumentIncarnation": N, "Events": [...]}``; each event has ``EventId``, ``EventType``
(``Preempt`` for a Spot eviction, ``Terminate`` for a scale-set removal; ``Reboot``, ``Redeploy``,
``Freeze`` and ``LiveMigration`` leave the VM in place), ``ResourceType``, ``Resources`` (the VM names it
affects: a scale set's placement group hears of its neighbours' events too), ``EventStatus``
(``Scheduled``, then ``Started``) and ``NotBefore`` (RFC 1123 time, empty once started). Azure gives a
Spot VM at least 30 s between the ``Preempt`` event and ``NotBefore``.

``POST`` of ``{"StartRequests": [{"EventId": ...}]}`` to the same URL acknowledges an event: Azure may
then go ahead at once instead of waiting for ``NotBefore``. The watcher acknowledges an event once every
job on its node was told (``told``), each event once per process.

The document is another party's data: each event is checked on its own (an id of GUID characters, a
node name that is one, a time between 2000 and 2200) and a bad one is skipped with one log line; only a
document that is not the documented shape fails the read.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from slurm_preempt import ids
from slurm_preempt.notice import utcnow
from slurm_preempt.watch.sources import Drain, NodeMap, SourceError, _http

log = logging.getLogger(__name__)

AZURE_BASE = "http://169.254.169.254"
AZURE_API_VERSION = "2020-07-01"
AZURE_NOTICE_SECONDS = 30.0  # Spot VMs: a Preempt event comes at least 30 s before NotBefore
REMOVING = ("Preempt", "Terminate")  # event types after which the VM is gone
_EVENT_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)


@dataclass
class AzureScheduledEventsSource:
    """This VM's Scheduled Events. ``node`` is its Slurm name; an event counts when one of its
    ``Resources``, renamed by ``node_map``, is that name (Azure compares VM names case-insensitively)."""

    node: str
    base_url: str
    timeout: float
    node_map: NodeMap = field(default_factory=NodeMap)
    name: str = "azure"
    acknowledged: set[str] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)  # each bad event is logged once, not on every poll
    _events: dict[str, Drain] = field(default_factory=dict)  # EventId -> its drain, from the last read
    _first_seen: dict[str, datetime] = field(default_factory=dict)  # EventId -> first read (no NotBefore)

    @property
    def url(self) -> str:
        return f"{self.base_url.rstrip('/')}/metadata/scheduledevents?api-version={AZURE_API_VERSION}"

    def fetch(self) -> list[Drain]:
        body = _http("GET", self.url, {"Metadata": "true"}, self.timeout)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise SourceError(f"{self.url} answered something that is not JSON") from None
        problems: list[str] = []
        self._events = parse_scheduled_events(data, self.node, self.node_map, self._first_seen, problems)
        for problem in problems:
            if problem not in self._warned:
                log.warning("azure: an event skipped (%s)", problem)
        self._warned = set(problems)
        return _earliest_per_node(self._events.values())

    def told(self, nodes: set[str]) -> None:
        """Every job on ``nodes`` was told: acknowledge their events not yet acknowledged (one POST).
        A failed POST is logged and tried again on the next call."""
        due = sorted(e for e, d in self._events.items() if d.node in nodes and e not in self.acknowledged)
        if not due:
            return
        body = json.dumps({"StartRequests": [{"EventId": event_id} for event_id in due]})
        try:
            _http(
                "POST", self.url, {"Metadata": "true", "Content-Type": "application/json"}, self.timeout, body
            )
        except SourceError as exc:
            log.warning("azure: cannot acknowledge %s (%s); trying again next poll", ", ".join(due), exc)
            return
        self.acknowledged.update(due)
        log.info("azure: acknowledged %s", ", ".join(due))


def parse_scheduled_events(
    data: Any,
    node: str,
    node_map: NodeMap,
    first_seen: dict[str, datetime],
    problems: list[str],
    now: datetime | None = None,
) -> dict[str, Drain]:
    """EventId -> Drain for the removing events of ``node``; why each bad event was skipped goes to
    ``problems``. ``first_seen`` (updated) stands in for the time of a started event without
    ``NotBefore``: it is due at once."""
    if not isinstance(data, dict) or not isinstance(data.get("Events"), list):
        raise SourceError("the scheduled events document has no Events list")
    now = now or utcnow()
    found: dict[str, Drain] = {}
    for event in data["Events"]:
        try:
            checked = _event(event, node, node_map, first_seen, now)
        except ValueError as exc:
            problems.append(ids.shorten(str(exc), 120))
            continue
        if checked is not None:
            found[checked[0]] = checked[1]
    for gone in set(first_seen) - set(found):
        del first_seen[gone]
    return found


def _event(
    event: Any, node: str, node_map: NodeMap, first_seen: dict[str, datetime], now: datetime
) -> tuple[str, Drain] | None:
    if not isinstance(event, dict):
        raise ValueError("not an object")
    kind = event.get("EventType")
    if kind not in REMOVING:
        return None  # a reboot or a freeze: the VM stays (or a type this source does not know)
    event_id = event.get("EventId")
    if not isinstance(event_id, str) or not _EVENT_ID.fullmatch(event_id):
        raise ValueError(f"{kind} event without a valid EventId")
    resources = event.get("Resources")
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise ValueError(f"event {event_id}: Resources is not a list of names")
    if not any(node_map.slurm_name(r).lower() == node.lower() for r in resources):
        return None  # a neighbour's event (scale sets tell the whole placement group)
    deadline = _not_before(event.get("NotBefore"), event_id, event.get("EventStatus"))
    if deadline is None:
        deadline = first_seen.setdefault(event_id, now)
    reason = f"Azure {kind} event {event_id}"
    drained = deadline - timedelta(seconds=AZURE_NOTICE_SECONDS)
    return event_id, Drain(node, reason, drained, "azure", AZURE_NOTICE_SECONDS)


def _not_before(value: Any, event_id: str, status: Any) -> datetime | None:
    """``NotBefore`` as UTC; None for a started event that no longer carries one."""
    if value in ("", None) and status == "Started":
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise ValueError(f"event {event_id}: no NotBefore time")
    try:
        parsed = parsedate_to_datetime(value)
        moment = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    except (TypeError, ValueError, OverflowError, IndexError):
        raise ValueError(f"event {event_id}: NotBefore {value!r} is not an RFC 1123 time") from None
    if not _EARLIEST <= moment <= _LATEST:
        raise ValueError(f"event {event_id}: NotBefore {value!r} is out of range")
    return moment


def _earliest_per_node(drains: Any) -> list[Drain]:
    found: dict[str, Drain] = {}
    for drain in drains:
        if drain.node not in found or drain.drain_time < found[drain.node].drain_time:
            found[drain.node] = drain
    return list(found.values())
