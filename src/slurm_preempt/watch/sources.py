"""Sources of "this node is going away": Slurm node state, the Together cluster API, cloud metadata.

Each source turns what it reads into ``Drain`` records (node, reason, drain time, grace). The drain
time is what the source recorded (Slurm's reason time, the provider's event time), never the moment
we looked, so the deadline in the notice is the truth however late the watcher is.

The HTTP sources use only the standard library (``urllib``), each request with a timeout. The API token
goes into one header and nowhere else: it is never part of a message, a log line or an error, and no
request follows a redirect (urllib would send the ``Authorization`` header on to whatever host a
redirect names). A provider's document is another party's data: each event is checked on its own (a
node name that is not one, a time outside 2000..2200) and a bad one is skipped, never the poll.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from slurm_preempt import ids
from slurm_preempt.errors import ConfigError
from slurm_preempt.notice import deadline, from_text, utcnow
from slurm_preempt.slurm.parse import Node

log = logging.getLogger(__name__)

TOGETHER_REASON = "TogetherPreemptionNotified"
DEFAULT_TOGETHER_BASE = "https://api.together.ai"
AWS_BASE = "http://169.254.169.254"
GCP_BASE = "http://metadata.google.internal"
AWS_NOTICE_SECONDS = 120.0  # AWS: a spot instance-action comes two minutes before the action
GCP_NOTICE_SECONDS = 30.0  # GCE: preemption takes 30 s from the moment `preempted` turns TRUE


class SourceError(Exception):
    """A source could not be read this time (network, timeout, garbage). The watcher logs and retries."""


@dataclass(frozen=True)
class Drain:
    """Node ``node`` will be taken away at ``drain_time + grace``."""

    node: str
    reason: str
    drain_time: datetime
    source: str
    grace: float
    down: bool = False  # Slurm says DOWN: its reason and time may have overwritten the drain's


class Source(Protocol):
    """A source other than Slurm's node state: its name (in logs and notices) and one read."""

    name: str

    def fetch(self) -> list[Drain]:
        """The drains it knows of now. SourceError when it cannot be read this time."""
        ...


# ---------------------------------------------------------------------------------------- Slurm


@dataclass(frozen=True)
class DrainRules:
    """Which drained or down nodes count as "going away".

    A node counts when it is DRAIN/DRAINING/DOWN and either carries ``feature`` or its reason matches
    one of ``include``; it never counts when its reason matches one of ``exclude`` (e.g. admin
    maintenance). Drains by slurm-preempt's own drill carry the provider's reason and count as real.
    """

    feature: str | None = None
    include: tuple[re.Pattern[str], ...] = ()
    exclude: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def from_strings(cls, feature: str | None, include: Iterable[str], exclude: Iterable[str]) -> DrainRules:
        return cls(feature or None, _compile(include, "reasons"), _compile(exclude, "exclude_reasons"))

    def counts(self, node: Node) -> bool:
        if not (node.drain or node.down):
            return False
        if any(p.search(node.reason) for p in self.exclude):
            return False
        by_feature = self.feature is not None and node.has_feature(self.feature)
        return by_feature or any(p.search(node.reason) for p in self.include)


def _compile(patterns: Iterable[str], key: str) -> tuple[re.Pattern[str], ...]:
    try:
        return tuple(re.compile(p) for p in patterns)
    except re.error as exc:
        raise ConfigError(f"[watch] {key}: bad regular expression ({exc})") from None


_EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
_LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=:-]{8,4096}")  # a bearer token's characters (RFC 6750), one line


def slurm_drains(nodes: Iterable[Node], rules: DrainRules, grace: float, now: datetime) -> list[Drain]:
    """The nodes of one ``sinfo`` answer that are going away. A node drained without a reason time
    (Slurm always records one; be safe) gets ``now``."""
    return [
        Drain(n.name, n.reason, n.reason_time or now, "slurm", grace, down=n.down)
        for n in nodes
        if rules.counts(n)
    ]


# ---------------------------------------------------------------------------------------- Together API

# The documentation names the array and the ``reason`` field but not the fields holding the node and
# the time of an event, so we accept the likely spellings (first found wins).
_NODE_KEYS = ("node_name", "node", "name", "hostname", "node_id", "instance_name", "instance_id")
_TIME_KEYS = (
    "timestamp",
    "time",
    "event_time",
    "created_at",
    "occurred_at",
    "first_timestamp",
    "last_timestamp",
    "first_seen",
    "last_seen",
)


@dataclass(frozen=True)
class NodeMap:
    """Provider node names -> Slurm node names: ``re.fullmatch(pattern)`` then ``match.expand(template)``;
    names that do not match are kept as they are (identity when no pattern is set)."""

    pattern: re.Pattern[str] | None = None
    template: str = r"\g<0>"

    @classmethod
    def from_config(cls, pattern: str | None, template: str | None) -> NodeMap:
        if not pattern:
            return cls()
        try:
            compiled = re.compile(pattern)
            if template:
                re.compile(pattern).sub(template, "")  # check group references early
        except (re.error, IndexError) as exc:
            raise ConfigError(f"[watch] node_name_pattern/template: {exc}") from None
        return cls(compiled, template or r"\g<0>")

    def slurm_name(self, provider_name: str) -> str:
        if self.pattern is None:
            return provider_name
        match = self.pattern.fullmatch(provider_name)
        return match.expand(self.template) if match else provider_name


def read_token(env_var: str = "TOGETHER_API_KEY", token_file: str | None = None) -> str:
    """The bearer token, from the environment or a file only its owner may read. ConfigError if none,
    or if it is not one line of token characters (never quoting it: the message may be logged)."""
    value = os.environ.get(env_var, "").strip()
    if value:
        return _checked_token(value, f"${env_var}")
    if not token_file:
        raise ConfigError(f"the together source needs a token: set {env_var} or [watch] api_token_file")
    path = Path(token_file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"cannot read the API token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"the API token file {path} is not a regular file")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"the API token file {path} is readable by others: chmod 600 {path}")
        if info.st_uid not in (0, os.geteuid()):
            raise ConfigError(f"the API token file {path} must belong to root or to you")
        raw = handle.read(8192)
    token = raw.decode("ascii", "replace").strip()
    if not token:
        raise ConfigError(f"the API token file {path} is empty")
    return _checked_token(token, f"the API token file {path}")


def _checked_token(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise ConfigError(f"{where} does not hold one line of token characters (letters, digits, ._~+/=:-)")
    return token


@dataclass
class TogetherSource:
    """Reads ``GET <base>/v1/compute/clusters/<id>`` and keeps ``TogetherPreemptionNotified`` events."""

    cluster_id: str
    token: str = field(repr=False)
    grace: float
    base_url: str
    timeout: float
    node_map: NodeMap = field(default_factory=NodeMap)
    name: str = "together"

    @property
    def url(self) -> str:
        return f"{self.base_url.rstrip('/')}/v1/compute/clusters/{self.cluster_id}"

    def fetch(self) -> list[Drain]:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        body = _http("GET", self.url, headers, self.timeout)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise SourceError(f"{self.url} answered something that is not JSON") from None
        return parse_together(data, self.node_map, self.grace)


def parse_together(data: Any, node_map: NodeMap, grace: float, now: datetime | None = None) -> list[Drain]:
    """Drains from a cluster document. Events past their deadline are over (the node is gone): skipped.
    Unreadable events are skipped one by one; a document without the array is an error."""
    if not isinstance(data, dict) or not isinstance(data.get("node_lifecycle_events"), list):
        raise SourceError("the cluster document has no node_lifecycle_events list")
    now = now or utcnow()
    found: dict[str, Drain] = {}
    for event in data["node_lifecycle_events"]:
        try:
            drain = _together_event(event, node_map, grace)
            if drain is None or deadline(drain.drain_time, grace) < now:
                continue
        except (ValueError, TypeError, OverflowError, re.error, IndexError) as exc:
            log.warning("together: an event skipped (%s)", ids.shorten(str(exc), 80))
            continue
        if drain.node not in found or drain.drain_time < found[drain.node].drain_time:
            found[drain.node] = drain
    return list(found.values())


def _together_event(event: Any, node_map: NodeMap, grace: float) -> Drain | None:
    if not isinstance(event, dict) or event.get("reason") != TOGETHER_REASON:
        return None
    name = next((event[k] for k in _NODE_KEYS if isinstance(event.get(k), str) and event[k]), None)
    moment = next((m for m in (_when(event[k]) for k in _TIME_KEYS if k in event) if m), None)
    if name is None or moment is None:
        return None
    node = node_map.slurm_name(name)
    if not ids.is_node_name(node):  # `pre[1` once aborted every poll until the event expired
        log.warning("together: event for %s skipped: not a Slurm node name", ids.shorten(node))
        return None
    message = event.get("message")
    reason = f"{TOGETHER_REASON}: {message[:200] if isinstance(message, str) else ''}".rstrip(": ")
    return Drain(node, reason, moment, "together", grace)


def _when(value: Any) -> datetime | None:
    """ISO 8601 text (``Z`` or offset; naive means UTC) or epoch seconds, between 2000 and 2200 in UTC
    (``9999-12-31T23:00:00-23:00`` is past what a datetime can hold once made UTC)."""
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            moment = datetime.fromtimestamp(float(value), timezone.utc)
        elif isinstance(value, str) and 0 < len(value) <= 64:
            moment = from_text(value).astimezone(timezone.utc)
        else:
            return None
    except (ValueError, OverflowError, OSError):
        return None
    return moment if _EARLIEST <= moment <= _LATEST else None


# ---------------------------------------------------------------------------------------- cloud metadata


@dataclass
class AwsSpotSource:
    """AWS spot ``instance-action`` (IMDSv2): present only when the instance will be stopped/terminated.
    The action time is the deadline; AWS gives two minutes, so the drain time is that minus 120 s."""

    node: str
    base_url: str
    timeout: float
    name: str = "aws"

    def fetch(self) -> list[Drain]:
        base = self.base_url.rstrip("/")
        token = _http(
            "PUT", f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, self.timeout
        )
        try:
            body = _http(
                "GET",
                f"{base}/latest/meta-data/spot/instance-action",
                {"X-aws-ec2-metadata-token": token.strip()},
                self.timeout,
            )
        except _NotFound:
            return []
        try:
            data = json.loads(body)
            action_time = from_text(data["time"])
        except (ValueError, KeyError, TypeError):
            raise SourceError("AWS instance-action is not the documented JSON") from None
        reason = f"AWS spot instance-action: {data.get('action', 'terminate')}"
        drained = action_time - timedelta(seconds=AWS_NOTICE_SECONDS)
        return [Drain(self.node, reason, drained, self.name, AWS_NOTICE_SECONDS)]


@dataclass
class GcpPreemptedSource:
    """GCP ``instance/preempted`` answers TRUE once preemption began; GCE gives 30 s from then."""

    node: str
    base_url: str
    timeout: float
    name: str = "gcp"
    _seen_at: datetime | None = None

    def fetch(self) -> list[Drain]:
        url = f"{self.base_url.rstrip('/')}/computeMetadata/v1/instance/preempted"
        body = _http("GET", url, {"Metadata-Flavor": "Google"}, self.timeout).strip().upper()
        if body != "TRUE":
            return []
        # GCP gives no time: the first moment we saw TRUE is the drain time, and stays so.
        self._seen_at = self._seen_at or utcnow()
        return [Drain(self.node, "GCP instance preempted", self._seen_at, self.name, GCP_NOTICE_SECONDS)]


# ---------------------------------------------------------------------------------------- HTTP


class _NotFound(SourceError):
    pass


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the HTTP error it is: urllib would otherwise repeat the request, with
    its ``Authorization`` header, to whatever host the redirect names."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 (urllib's signature)
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _http(method: str, url: str, headers: dict[str, str], timeout: float, body: str | None = None) -> str:
    """One request; SourceError on anything but a 2xx answer (a redirect included). Messages never
    carry the headers."""
    data = body.encode() if body is not None else b"" if method == "PUT" else None
    request = urllib.request.Request(url, method=method, headers=headers, data=data)
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            return answer.read(4_000_000).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise _NotFound(f"{url}: 404") from None
        if 300 <= exc.code < 400:
            raise SourceError(f"{url} answered a redirect (HTTP {exc.code}): not followed") from None
        raise SourceError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise SourceError(f"{url} did not answer ({type(why).__name__}: {why})") from None
    except ValueError:  # a bad URL, or a header value urllib refuses: its message would quote the header
        raise SourceError(f"cannot send a request to {url!r}") from None
