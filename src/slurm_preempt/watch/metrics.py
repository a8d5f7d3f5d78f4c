"""The watcher's metrics for Prometheus (``watch --metrics HOST:PORT``), through ``prometheus_client``.

Everything counted here comes from what the watcher already says: each poll's outcome and duration
(``observe_poll``, from the loop), and the JSON events of its acts (``observe``, the same stream as
``--json``): drains seen, notices written, signals sent, fast restarts, fallbacks, grow-backs. Whether a
told job kept its work is read from its ledger when the watcher restarts it: a ``checkpoint_saved`` marked
``final`` after its notice counts it saved, none lost.

Label values are a closed set (sources, outcomes), never job ids, node names, job names or comments:
those are user-controlled or unbounded, and a label value is a new time series in every Prometheus
that scrapes the watcher. The exposition is served by ``prometheus_client`` (OpenMetrics when the
scraper asks for it), bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from slurm_preempt import ledger
from slurm_preempt.errors import ConfigError
from slurm_preempt.notice import from_text

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
SOURCES = ("slurm", "together", "aws", "gcp", "azure")  # the only values the source label takes
POLL_OUTCOMES = ("ok", "standby", "slurm_error", "error")
POLL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def parse_address(value: Any) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (then 127.0.0.1). ValueError unless the port is 1..65535."""
    host, _, port = str(value).strip().rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if (
        not re.fullmatch(r"\d{1,5}", port)
        or not 0 < int(port) <= 65535
        or not re.fullmatch(r"[\w.:-]+", host)
    ):
        raise ValueError("not HOST:PORT or PORT (e.g. 127.0.0.1:9464)")
    return host, int(port)


def address(value: Any) -> str:
    """The ``metrics`` key: "" (off), or an address ``parse_address`` takes."""
    if value in ("", None):
        return ""
    parse_address(value)
    return str(value).strip()


def start(watcher: Any) -> Metrics | None:
    """Serve the metrics of ``watcher`` (a ``Watcher``) when its settings name an address."""
    if not watcher.settings.metrics:
        return None
    host, port = parse_address(watcher.settings.metrics)
    metrics = Metrics()

    def source_of(node: str) -> str | None:
        event = watcher.sent.events.get(node)
        return event.source if event is not None else None

    metrics.bind(watcher.ctx.state_dir, source_of)
    inner = watcher.ctx.emit

    def emit(event: dict[str, Any]) -> None:
        inner(event)
        metrics.observe(event)

    watcher.ctx.emit = emit
    metrics.serve(host, port)
    return metrics


def _source(value: Any) -> str:
    return value if value in SOURCES else "other"


class Metrics:
    """The counters, histograms and gauges of one watcher, in a registry of their own."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError(
                "--metrics needs the prometheus_client package: pip install 'slurm-preempt[metrics]'"
            ) from None
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.polls = prom.Counter("slurm_preempt_polls", "Polls, by outcome", ["outcome"], registry=r)
        self.poll_seconds = prom.Histogram(
            "slurm_preempt_poll_duration_seconds", "Seconds one poll took", buckets=POLL_BUCKETS, registry=r
        )
        self.drains = prom.Counter(
            "slurm_preempt_drains", "Drain events seen, by source", ["source"], registry=r
        )
        self.notices = prom.Counter(
            "slurm_preempt_notices", "Notices written, by source", ["source"], registry=r
        )
        self.signals = prom.Counter(
            "slurm_preempt_signals", "Notice signals sent, by source", ["source"], registry=r
        )
        self.latency = prom.Histogram(
            "slurm_preempt_signal_latency_seconds",
            "Seconds from the drain time (as the source recorded it) to the signal sent",
            ["source"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.outcomes = prom.Counter(
            "slurm_preempt_jobs_told", "Told jobs restarted, by whether a final checkpoint saved their work",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.fast_restarts = prom.Counter("slurm_preempt_fast_restarts", "Requeue holds lifted", registry=r)
        self.fallbacks = prom.Counter("slurm_preempt_fallbacks", "Jobs moved to standard nodes", registry=r)
        self.enforced = prom.Counter(
            "slurm_preempt_enforced_requeues", "Jobs requeued near the deadline", registry=r
        )
        self.grow_backs = prom.Counter(
            "slurm_preempt_grow_backs", "Jobs below their MAX nodes told to requeue larger", registry=r
        )
        self.lease = prom.Gauge(
            "slurm_preempt_lease_held", "1 while this watcher acts, 0 on standby", registry=r
        )
        for outcome in POLL_OUTCOMES:
            self.polls.labels(outcome)  # every series exists from the start: rate() and alerts see 0
        for source in SOURCES:
            for family in (self.drains, self.notices, self.signals):
                family.labels(source)
        for outcome in ("saved", "lost"):
            self.outcomes.labels(outcome)
        self._state_dir: Path | None = None
        self._source_of: Callable[[str], str | None] = lambda _node: None

    def bind(self, state_dir: Path | None, source_of: Callable[[str], str | None]) -> None:
        """Where the ledger is, and which source a node's open event came from (the watcher's state)."""
        self._state_dir, self._source_of = state_dir, source_of

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` from a daemon thread. ConfigError when the address cannot be bound."""
        try:
            self._prom.start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics {host}:{port}: cannot listen there ({exc.strerror})") from None
        log.info("metrics on http://%s:%d/metrics", host, port)

    def observe_poll(self, outcome: str, seconds: float) -> None:
        self.polls.labels(outcome).inc()
        if outcome != "standby":
            self.poll_seconds.observe(seconds)
        self.lease.set(0 if outcome == "standby" else 1)

    def observe(self, event: Mapping[str, Any]) -> None:
        """One JSON event of the watcher (``--json``'s stream)."""
        kind = event.get("event")
        if kind == "drain_seen":
            self.drains.labels(_source(event.get("source"))).inc()
        elif kind == "notice_sent":
            self.notices.labels(_source(event.get("source_kind"))).inc()
        elif kind == "signal_sent":
            self._signal(event)
        elif kind == "fast_restart":
            self.fast_restarts.inc()
            self._outcome(str(event.get("job_id", "")))
        elif kind == "fallback":
            self.fallbacks.inc()
        elif kind == "enforced_requeue":
            self.enforced.inc()
        elif kind == "grow_back":
            self.grow_backs.inc()

    def _signal(self, event: Mapping[str, Any]) -> None:
        source = _source(self._source_of(str(event.get("node", ""))))
        self.signals.labels(source).inc()
        drained = _drain_time(event.get("event_id"))
        sent = _time(event.get("time"))
        if drained is not None and sent is not None:
            self.latency.labels(source).observe(max(0.0, (sent - drained).total_seconds()))

    def _outcome(self, job_id: str) -> None:
        """A job restarted after it was told: saved when its ledger has a final checkpoint after the
        notice; a job never told (no notice) is not counted."""
        if self._state_dir is None or not job_id:
            return
        try:
            events = ledger.events(self._state_dir, job_id)
        except (OSError, ValueError) as exc:
            log.debug("metrics: cannot read the ledger of job %s: %s", job_id, exc)
            return
        # In the ledger's order (files named by nanoseconds; the times inside are whole seconds).
        told = [i for i, e in enumerate(events) if e.get("kind") == "notice_sent"]
        grown = [i for i, e in enumerate(events) if e.get("kind") == "grow_back"]
        if not told or (grown and grown[-1] > told[-1]):  # a grow-back's requeue: no drain, nothing at risk
            return
        after = events[told[-1] + 1 :]
        final = any(e.get("kind") == "checkpoint_saved" and e.get("final") is True for e in after)
        self.outcomes.labels("saved" if final else "lost").inc()


def _drain_time(event_id: Any) -> datetime | None:
    """The drain time inside an event id (``node@time``, ``notice.event_id``)."""
    if not isinstance(event_id, str) or "@" not in event_id:
        return None
    return _time(event_id.rsplit("@", 1)[1])


def _time(value: Any) -> datetime | None:
    try:
        return from_text(value) if isinstance(value, str) else None
    except ValueError:
        return None
