"""Drain events: which nodes are going away now, which events start and which are over.

A node's event starts the first time a source reports it going away and keeps the first drain time
seen (Slurm overwrites the reason and its time when a drained node then goes DOWN). It ends when Slurm
stops reporting the node (back in service), or is drained again with a new time while not DOWN (resumed
and drained between two looks); a provider event ends only once its deadline is past, so an API that
fails or forgets an event never makes a job be told twice.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from slurm_preempt.notice import deadline, to_text
from slurm_preempt.watch.actions import Emit
from slurm_preempt.watch.sentstate import NodeEvent, SentState
from slurm_preempt.watch.sources import Drain

log = logging.getLogger(__name__)

# A provider event is kept this long past its deadline: the provider's clock and ours may differ a
# little, and a node still listed as going away must not look like a new event.
PROVIDER_EVENT_LINGER = timedelta(seconds=60)
SHOWN = 10  # nodes named in one line about events left by an earlier run


def update(
    sent: SentState, drains: list[Drain], scope: set[str] | None, now: datetime, emit: Emit
) -> list[str]:
    """Start events for nodes newly going away, end those that are over; return the new ones' nodes.
    ``scope``: only these nodes (a sidecar's); None for all."""
    earliest: dict[str, Drain] = {}
    for drain in drains:
        if scope is not None and drain.node not in scope:
            continue
        if drain.node not in earliest or drain.drain_time < earliest[drain.node].drain_time:
            earliest[drain.node] = drain
    _end(sent, [n for n in sent.events if _over(sent.events[n], earliest.get(n), now)])
    for node in earliest:
        sent.saw(node)
    new = sorted(n for n in earliest if n not in sent.events)
    for node in new:
        d = earliest[node]
        sent.open_event(NodeEvent(node, d.drain_time, d.reason, d.source, d.grace))
        log.info("node %s: going away (%s: %r at %s)", node, d.source, d.reason, to_text(d.drain_time))
        emit({"event": "drain_seen", "node": node, "source": d.source, "reason": d.reason,
              "drain_time": to_text(d.drain_time), "grace": d.grace})  # fmt: skip
    return new


def _end(sent: SentState, nodes: list[str]) -> None:
    """Forget the events that are over. Each is logged once, by the watcher that saw it open; those a
    state file kept from an earlier run, over before this watcher ever saw them, in one line."""
    inherited = sorted(n for n in nodes if not sent.events[n].seen)
    for node in nodes:
        if sent.events[node].seen:
            log.info("node %s: back in service or drained anew; its event is over", node)
        sent.forget_node(node)
    if inherited:
        more = f" and {len(inherited) - SHOWN} more" if len(inherited) > SHOWN else ""
        log.info(
            "%d drain event(s) left open by an earlier run are over: %s%s",
            len(inherited),
            ", ".join(inherited[:SHOWN]),
            more,
        )


def _over(known: NodeEvent, current: Drain | None, now: datetime) -> bool:
    if current is not None:
        # A drain time other than the one remembered, on a node not DOWN: the node was resumed and
        # drained again while we were not looking (a DOWN overwrites the time of the same event).
        return current.source == known.source and current.drain_time != known.drain_time and not current.down
    if known.source == "slurm":
        return True
    return now > deadline(known.drain_time, known.grace) + PROVIDER_EVENT_LINGER
