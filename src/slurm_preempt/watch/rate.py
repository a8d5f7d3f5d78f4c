"""The live preemption rate: how often the watcher sees nodes of each pool taken, published for jobs.

A pool is the nodes sharing one set of features (``preemptible``, ``a100,preemptible``). The rate of a
pool is its preemptions (drain events the watcher opened, each node and drain time once) over its
node-hours in a long window (``rate_window``, 6 h by default). Preemption rates jump (a GPU type goes
from rarely to often reclaimed within minutes), so the short window (``rate_jump_window``, 15 min)
takes over when its count is one the long rate would give less than once in a hundred (Poisson):
a jump shows within a few preemptions, a quiet spell as soon as the short window is empty enough.

Published atomically to ``<state_dir>/preemption-rate.json`` (world-readable: jobs read it) with, per
pool, the rate, the window and the count behind it; the same file keeps the recent preemption times,
which a restarted watcher takes back only from a file of its own user. A drain time in the future
or outside the window, a node of no known pool, or the same node and time twice never counts.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from slurm_preempt import durable
from slurm_preempt.notice import from_text, to_text

log = logging.getLogger(__name__)

FILE_NAME = "preemption-rate.json"
CLOCK_SKEW = timedelta(seconds=60)  # a drain time this far ahead of our clock is still believed
JUMP_P = 0.01  # the short window wins when the long rate gives its count less often than this
MAX_EVENTS = 100_000  # per pool; a window holding more keeps the newest


@dataclass(frozen=True)
class PoolRate:
    pool: str
    nodes: int
    preemptions: int  # behind the rate
    window_seconds: float
    per_node_hour: float
    jump: bool  # the short window's rate (a change the long window does not show yet)

    def to_json(self) -> dict[str, Any]:
        mtbp = 1.0 / self.per_node_hour if self.per_node_hour > 0 else None
        return {
            "features": self.pool.split(",") if self.pool else [],
            "nodes": self.nodes,
            "preemptions": self.preemptions,
            "window_seconds": round(self.window_seconds, 1),
            "per_node_hour": round(self.per_node_hour, 6),
            "mtbp_hours": None if mtbp is None else round(mtbp, 4),
            "jump": self.jump,
        }


def pool_of(features: Iterable[str]) -> str:
    return ",".join(sorted(set(features)))


class RateTracker:
    """Preemption times per pool, and the pools' sizes, in memory; ``estimate`` gives the rates."""

    def __init__(self, window: float, jump_window: float, started: datetime):
        self.window, self.jump_window = window, jump_window
        self.started = started
        self.times: dict[str, dict[str, datetime]] = {}  # pool -> "node@time" -> drain time
        self.pools: dict[str, int] = {}

    def set_pools(self, counts: Mapping[str, int]) -> None:
        self.pools = {pool: count for pool, count in counts.items() if count > 0}

    def saw(self, node: str, pool: str, drain_time: datetime, now: datetime) -> bool:
        """Count one preemption; False (and nothing counted) for one that cannot be believed."""
        if pool not in self.pools or drain_time > now + CLOCK_SKEW:
            return False
        if drain_time < now - timedelta(seconds=self.window):
            return False
        times = self.times.setdefault(pool, {})
        times[f"{node}@{to_text(drain_time)}"] = drain_time
        if len(times) > MAX_EVENTS:
            for stale in sorted(times, key=times.__getitem__)[: len(times) - MAX_EVENTS]:
                del times[stale]
        return True

    def forget_old(self, now: datetime) -> None:
        oldest = now - timedelta(seconds=self.window)
        for pool, times in self.times.items():
            self.times[pool] = {k: t for k, t in times.items() if t >= oldest}

    def estimate(self, now: datetime) -> list[PoolRate]:
        self.forget_old(now)
        return [self._pool_rate(pool, nodes, now) for pool, nodes in sorted(self.pools.items())]

    def _pool_rate(self, pool: str, nodes: int, now: datetime) -> PoolRate:
        times = list(self.times.get(pool, {}).values())
        span = max(min(self.window, (now - self.started).total_seconds()), 1.0)
        short = min(self.jump_window, span)
        long_count = len(times)
        short_count = sum(1 for t in times if t >= now - timedelta(seconds=short))
        long_rate = long_count / (nodes * span / 3600.0)
        # The short window against the rate before it, so a jump is not measured against itself.
        before = (long_count - short_count) / max(span - short, 1.0)
        if short < span and _unlikely(short_count, before * short):
            return PoolRate(pool, nodes, short_count, short, short_count / (nodes * short / 3600.0), True)
        return PoolRate(pool, nodes, long_count, span, long_rate, False)

    # ------------------------------------------------------------------------------- the file

    def publish(self, state_dir: Path, now: datetime) -> dict[str, Any]:
        data = {
            "updated": to_text(now),
            "pools": {r.pool: r.to_json() for r in self.estimate(now)},
            "since": to_text(self.started),
            "times": {
                p: sorted(to_text(t) + " " + k.split("@", 1)[0] for k, t in ts.items())
                for p, ts in self.times.items()
                if ts
            },  # fmt: skip
        }
        durable.write_atomic(Path(state_dir) / FILE_NAME, json.dumps(data, indent=1) + "\n", sync=False)
        return data

    def take_back(self, state_dir: Path, now: datetime) -> int:
        """The times an earlier run of ours published (a file of another user is not believed)."""
        path = Path(state_dir) / FILE_NAME
        try:
            if path.lstat().st_uid != os.geteuid():
                log.warning("%s belongs to another user: its preemption times are ignored", path)
                return 0
            data = json.loads(path.read_text())
            since = from_text(data["since"])
            taken = 0
            for pool, lines in data["times"].items():
                for line in lines:
                    when, node = line.split(" ", 1)
                    taken += self.saw(node, pool, from_text(when), now)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("%s unreadable (%s): the preemption rate starts afresh", path, exc)
            return 0
        if taken:
            self.started = min(self.started, max(since, now - timedelta(seconds=self.window)))
        return taken


def read_published(state_dir: Path) -> dict[str, Any] | None:
    """The published file as JSON (``report`` and jobs read it), or None."""
    try:
        data = json.loads((Path(state_dir) / FILE_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pools"), dict) else None


def _unlikely(count: int, expected: float) -> bool:
    """``count`` far from a Poisson mean of ``expected`` (either tail below JUMP_P)."""
    if count > expected:
        return count >= 2 and _poisson_tail_from(count, expected) < JUMP_P
    return math.exp(-expected) < JUMP_P and count == 0


def _poisson_tail_from(count: int, mean: float) -> float:
    """P(X >= count) for a Poisson mean ``mean``."""
    if mean <= 0:
        return 0.0 if count > 0 else 1.0
    below = sum(math.exp(k * math.log(mean) - mean - math.lgamma(k + 1)) for k in range(count))
    return max(0.0, 1.0 - below)


class RatePublisher:
    """The watcher's side: new drain events counted, the file written when it changed or is a minute
    old. The pools' sizes take one ``sinfo`` of every node, asked only in a poll that opened drain
    events and at most every ``refresh`` seconds: a quiet poll stays at its two queries. Failures are
    logged, never raised: the rate must not stop the watcher telling jobs."""

    def __init__(self, state_dir: Path, window: float, jump_window: float, refresh: float, now: datetime):
        self.state_dir = Path(state_dir)
        self.tracker = RateTracker(window, jump_window, now)
        self.refresh = refresh
        self._pools_at: datetime | None = None
        self._published_at: datetime | None = None
        self._taken_back = False

    def after_poll(self, all_nodes: Any, drained: Iterable[Any], new: Iterable[str], now: datetime) -> None:
        """``all_nodes()`` lists every node (called only when the pool sizes are due); ``drained``: this
        poll's drained and down nodes; ``new``: the nodes whose drain event opened in this poll."""
        new = list(new)
        try:
            due = self._pools_at is None or (now - self._pools_at).total_seconds() >= self.refresh
            if new and due:
                self.tracker.set_pools(_pool_counts(all_nodes()))
                self._pools_at = now
                if not self._taken_back:
                    self._taken_back = True
                    self.tracker.take_back(self.state_dir, now)
            by_name = {n.name: n for n in drained}
            counted = [n for n in new if n in by_name and self._count(by_name[n], now)]
            stale = self._published_at is None or (now - self._published_at).total_seconds() >= 60
            if counted or stale:
                self.tracker.publish(self.state_dir, now)
                self._published_at = now
        except Exception as exc:  # noqa: BLE001 - the rate is a by-product; the notices must go on
            log.warning("preemption rate not updated: %s", exc)

    def _count(self, node: Any, now: datetime) -> bool:
        when = node.reason_time
        return when is not None and self.tracker.saw(node.name, pool_of(node.features), when, now)


def _pool_counts(nodes: Iterable[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        pool = pool_of(node.features)
        counts[pool] = counts.get(pool, 0) + 1
    return counts


def describe(published: Mapping[str, Any] | None) -> list[str]:
    """The published rate in lines for people (``slurm-preempt report``)."""
    if not published or not published.get("pools"):
        return []
    lines = [f"live preemption rate (the watcher, {published.get('updated', '?')}):"]
    for pool, figures in sorted(published["pools"].items()):
        try:
            rate, window = float(figures["per_node_hour"]), float(figures["window_seconds"]) / 3600
            mtbp = f", a node every {figures['mtbp_hours']:.1f} h" if figures.get("mtbp_hours") else ""
            jump = " (a jump: the short window)" if figures.get("jump") else ""
            lines.append(
                f"  {pool or '(no feature)'}: {rate:.3f} per node-hour{mtbp}: {figures['preemptions']} "
                f"preemption(s) of {figures['nodes']} node(s) in the last {window:.2f} h{jump}"
            )
        except (KeyError, TypeError, ValueError):
            lines.append(f"  {pool}: unreadable")
    return lines
