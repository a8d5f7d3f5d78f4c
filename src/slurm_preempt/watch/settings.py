"""The watcher's settings: the ``[watch]`` config section, each key declared once in ``Settings``
(``keytable``: default, conversion and check, the docs' line), and building a watcher from it and
command-line overrides.

Everything is checked here, at start: a bad key or value, a bad regex, a missing token or a URL that is
not http(s) fails with one clear line before the first poll, never later in the loop.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_preempt import config as configmod
from slurm_preempt import keytable
from slurm_preempt.errors import ConfigError, SlurmError, UsageError
from slurm_preempt.keytable import flag, key, seconds, text, texts, whole
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS
from slurm_preempt.records.prices import Prices
from slurm_preempt.slurm import pyslurm_backend
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.slurm.pyslurm_backend import BACKENDS
from slurm_preempt.watch.actions import Emit
from slurm_preempt.watch.azure import AZURE_BASE, AzureScheduledEventsSource
from slurm_preempt.watch.lease import Lease
from slurm_preempt.watch.metrics import address as metrics_address
from slurm_preempt.watch.sources import (
    AWS_BASE,
    DEFAULT_TOGETHER_BASE,
    GCP_BASE,
    AwsSpotSource,
    DrainRules,
    GcpPreemptedSource,
    NodeMap,
    Source,
    TogetherSource,
    read_token,
)
from slurm_preempt.watch.watcher import Watcher, load_sent, state_path

KNOWN_SOURCES = ("slurm", "together", "aws", "gcp", "azure")


def _regex(value: Any) -> str:
    try:
        re.compile(text(value))
    except re.error as exc:
        raise ValueError(f"bad regular expression ({exc})") from None
    return value


def _patterns(value: Any) -> tuple[str, ...]:
    return tuple(_regex(pattern) for pattern in texts(value))


def _sources(value: Any) -> tuple[str, ...]:
    found = texts(value)
    unknown = [s for s in found if s not in KNOWN_SOURCES]
    if unknown:
        raise ValueError(f"unknown source {', '.join(unknown)}; known: {', '.join(KNOWN_SOURCES)}")
    return found


def _http_url(value: Any) -> str:
    if not isinstance(value, str) or not re.match(r"^https?://[^\s/]+", value):
        raise ValueError("not an http:// or https:// URL")
    return value


def _backend(value: Any) -> str:
    chosen = text(value)
    if chosen not in BACKENDS:
        raise ValueError(f"not one of {', '.join(BACKENDS)}")
    return chosen


def _cluster_id(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]*", value.strip()):
        raise ValueError("not a cluster id (letters, digits, - _ .)")
    return value.strip()


@dataclass(frozen=True)
class Settings:
    """What a watcher does: the ``[watch]`` section, one declaration per key."""

    interval: float = key(5.0, seconds(positive=True), "seconds between polls (daemon)")
    # A modest rate: every job of a user runs one.
    sidecar_interval: float = key(
        5.0, seconds(positive=True), "seconds between polls of a sidecar (`--interval` overrides both)"
    )
    grace: float = key(
        DEFAULT_GRACE_SECONDS, seconds(), "seconds from drain to removal (deadline = drain time + grace)"
    )
    feature: str = key("preemptible", text, 'node feature whose drains count (`""`: none)')
    reasons: tuple[str, ...] = key(
        (r"^TogetherPreemptionNotified",), _patterns, "reason regexes that count on any node"
    )
    exclude_reasons: tuple[str, ...] = key((), _patterns, "reason regexes that never count")
    enforce: bool = key(False, flag, "requeue opted-in jobs still running near the deadline")
    enforce_margin: float = key(30.0, seconds(), "seconds before the deadline")
    # A job allocated moments ago may not have installed its trap yet: its notice is written at once,
    # its signal waits for the first poll this long after its start (squeue's StartTime, whole seconds:
    # at least 2 s after the allocation). Its deadline does not move.
    signal_after_start: float = key(
        3.0,
        seconds(),
        "a job that started less than this long ago gets its notice at once and its signal at the "
        "first poll after (its script may not trap it yet)",
    )
    fast_restart: bool = key(True, flag, "`starttime=now` for requeued opted-in jobs")
    rate_window: float = key(
        21600.0, seconds(positive=True), "seconds of preemptions behind the published preemption rate"
    )
    rate_jump_window: float = key(
        900.0, seconds(positive=True), "short window whose rate wins when it differs (a jump)"
    )
    rate_pool_refresh: float = key(
        600.0, seconds(positive=True), "seconds between counts of the pools' nodes (one `sinfo`)"
    )
    fallback: bool = key(True, flag, "apply the jobs' fallback policies")
    grow_back: bool = key(
        False,
        flag,
        "tell opted-in jobs below their MAX nodes to requeue when idle nodes match them "
        "(`slurm-preempt:grow-back=SECONDS`)",
    )
    grow_back_min_window: float = key(
        600.0, seconds(positive=True), "least seconds between two grow-backs of a job, whatever it asks"
    )
    grow_back_every: float = key(
        60.0, seconds(positive=True), "seconds between two looks for idle nodes (one `sinfo`)"
    )
    max_backoff: float = key(60.0, seconds(positive=True), "longest wait after failed polls")
    slurm_timeout: float = key(15.0, seconds(positive=True), "timeout of each Slurm command")
    backend: str = key(
        "auto",
        _backend,
        "how the poll reads nodes and jobs: `cli` (sinfo, squeue), `pyslurm` (when its release is the "
        "running Slurm's), `auto` (pyslurm when it can be, else the CLI); writes use the CLI",
    )
    crash_after: int = key(
        3, whole(1), "polls in a row failing with an unexpected error before the watcher exits 1"
    )
    lease_ttl: float = key(
        30.0,
        seconds(positive=True),
        "seconds of silence after which a standby watcher takes over (> `slurm_timeout`)",
    )
    sources: tuple[str, ...] = key(("slurm",), _sources, "add `together`, `aws`, `gcp`, `azure`")
    api_base_url: str = key(DEFAULT_TOGETHER_BASE, _http_url, "Together API")
    cluster_id: str = key("", _cluster_id, "Together cluster id")
    api_token_env: str = key("TOGETHER_API_KEY", text, "variable holding the token")
    api_token_file: str = key("", text, "file holding the token (mode 600)")
    api_timeout: float = key(5.0, seconds(positive=True), "seconds per API request")
    node_name_pattern: str = key(
        "", _regex, "provider node names to rename: a regex matching the whole name (`gpu-dp-(\\d+)`)"
    )
    node_name_template: str = key(
        "", text, "their Slurm names, from the pattern's groups (`pre\\1`); unset: the name as it is"
    )
    aws_metadata_url: str = key(AWS_BASE, _http_url, "AWS instance metadata, base URL")
    gcp_metadata_url: str = key(GCP_BASE, _http_url, "GCP instance metadata, base URL")
    azure_metadata_url: str = key(
        AZURE_BASE, _http_url, "Azure instance metadata (Scheduled Events), base URL"
    )
    metadata_timeout: float = key(2.0, seconds(positive=True), "seconds per metadata request")
    metrics: str = key(
        "", metrics_address, 'serve Prometheus metrics on `HOST:PORT` (or `PORT`: on 127.0.0.1); `""`: off'
    )
    rules: DrainRules = field(init=False, repr=False, compare=False)  # from feature and the reasons

    def __post_init__(self) -> None:
        rules = DrainRules.from_strings(self.feature, self.reasons, self.exclude_reasons)
        object.__setattr__(self, "rules", rules)
        # The holder cannot beat while it waits for one Slurm command: a shorter lease would pass to
        # the standby whenever Slurm is slow.
        if self.lease_ttl <= self.slurm_timeout:
            raise ConfigError(
                f"[watch] lease_ttl ({self.lease_ttl:g}) must be longer than "
                f"slurm_timeout ({self.slurm_timeout:g})"
            )


# Every key with its default, as a config file writes it (the CLI's help, tests).
DEFAULTS: dict[str, Any] = keytable.defaults(Settings)


def merged(section: Mapping[str, Any], overrides: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """Defaults, then the config file, then the command line (None means "not given"), each value
    checked: a bad one in the file is a ConfigError, on the command line a UsageError."""
    values, problems = keytable.read(Settings, section)
    keytable.refuse("watch", Settings, problems, where)
    given, wrong = keytable.read(Settings, overrides)
    if wrong:
        option = wrong[0]
        raise UsageError(
            f"--{option.key.replace('_', '-')} {option.value!r}: {option.why or 'no such option'}"
        )
    return {**{k.name: k.default for k in keytable.keys(Settings)}, **values, **given}


def settings_from(values: Mapping[str, Any]) -> Settings:
    """Settings from values ``merged`` checked (the keys checked together: ConfigError)."""
    return Settings(**values)


def sources_from(settings: Settings, local_node: str | None = None) -> list[Source]:
    """The extra sources (``slurm`` is always read). Metadata sources need ``local_node`` (sidecar)."""
    found: list[Source] = []
    if "together" in settings.sources:
        found.append(_together(settings))
    for name in ("aws", "gcp", "azure"):
        if name not in settings.sources:
            continue
        if local_node is None:
            raise ConfigError(f"[watch] source {name} reads this machine's metadata: use it with --sidecar")
        found.append(_metadata_source(name, settings, local_node))
    return found


def _metadata_source(name: str, settings: Settings, local_node: str) -> Source:
    timeout = settings.metadata_timeout
    if name == "aws":
        return AwsSpotSource(node=local_node, base_url=settings.aws_metadata_url, timeout=timeout)
    if name == "gcp":
        return GcpPreemptedSource(node=local_node, base_url=settings.gcp_metadata_url, timeout=timeout)
    node_map = NodeMap.from_config(settings.node_name_pattern, settings.node_name_template)
    return AzureScheduledEventsSource(local_node, settings.azure_metadata_url, timeout, node_map)


def _together(settings: Settings) -> TogetherSource:
    if not settings.cluster_id:
        raise ConfigError("[watch] cluster_id must be set (letters, digits, - _ .) for the together source")
    token = read_token(settings.api_token_env, settings.api_token_file or None)
    return TogetherSource(
        cluster_id=settings.cluster_id,
        token=token,
        grace=settings.grace,
        base_url=settings.api_base_url,
        node_map=NodeMap.from_config(settings.node_name_pattern, settings.node_name_template),
        timeout=settings.api_timeout,
    )


def refuse_preemptible_host(slurm: WatcherSlurm, feature: str | None, hostname: str | None = None) -> None:
    """The daemon must outlive the nodes it watches: refuse to run on a node with the feature."""
    if not feature:
        return
    host = (hostname or socket.gethostname()).split(".")[0]
    try:
        found = slurm.nodes(names=[host])  # one node: `sinfo -N` of every node is slow on big clusters
    except (SlurmError, UsageError):
        found = slurm.nodes()
    for node in found:
        if node.name == host and node.has_feature(feature):
            raise UsageError(
                f"this host is Slurm node {host}, which has feature {feature}: the cluster watcher "
                "would vanish with it; run it on a standard node (or pass --allow-preemptible-host)"
            )


def state_dir_from(config_state_dir: Path, override: Path | None) -> Path:
    return Path(override) if override else Path(config_state_dir)


def build(
    overrides: Mapping[str, Any],
    *,
    job_id: str | None = None,
    user: str | None = None,
    config_file: Path | None = None,
    state_dir: Path | None = None,
    allow_preemptible_host: bool = False,
    emit: Emit = lambda _e: None,
) -> Watcher:
    """A ready watcher: config searched (or ``config_file``), every setting checked, state loaded.
    ``job_id``: a sidecar; ``user``: that user's own watcher; neither: the cluster daemon."""
    if job_id is not None and not re.fullmatch(r"\d+", str(job_id)):
        raise UsageError(f"--job needs a numeric Slurm job id (the unique id), not {job_id!r}")
    paths = [*configmod.search_path()[:2], config_file] if config_file else None
    if config_file and not Path(config_file).exists():
        raise ConfigError(f"--config {config_file} does not exist")
    conf = configmod.load(paths)
    settings = settings_from(merged(conf.section("watch"), overrides, ", ".join(map(str, conf.sources))))
    prices = Prices.from_config(conf.section("report"))  # fallback-cost's; a bad one: ConfigError
    if job_id is not None and overrides.get("interval") is None:
        settings = replace(settings, interval=settings.sidecar_interval)
    slurm = Slurm(timeout=settings.slurm_timeout, cwd="/")  # root's commands never from a user's folder
    local_node = None
    if job_id is not None:
        # Inside a job Slurm names the node in SLURMD_NODENAME (on the test cluster every host is localhost).
        local_node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    elif not allow_preemptible_host:
        refuse_preemptible_host(slurm, settings.rules.feature)
    sources = sources_from(settings, local_node)
    folder = state_dir_from(conf.state_dir(), state_dir)
    path = state_path(folder, job_id, user)
    if user is not None:
        check_writable(folder, user, chosen=bool(state_dir) or conf.names_state_dir())
    sent = load_sent(path)
    # A sidecar is alone with its job; the daemon and a user's watcher may run as a pair on two hosts.
    lease = Lease(path, settings.lease_ttl) if job_id is None else None
    # Chosen once, when everything else is known to be right: the reads may go through pyslurm.
    reads = pyslurm_backend.choose(settings.backend, slurm)
    watcher = Watcher(
        reads, settings, sent, folder, sources, emit=emit, job_id=job_id, user=user, lease=lease,
        detached=job_id is None,
    )  # fmt: skip
    watcher.ctx.prices = prices
    return watcher


def check_writable(folder: Path, user: str, chosen: bool = True) -> None:
    """A user's watcher writes notices and its state under ``folder``: say at start if it cannot.
    ``chosen``: a setting named the folder; else it is the site's default, which admins made."""
    try:
        for sub in ("notices", "watcher"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            probe = folder / sub / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
    except OSError as exc:
        site = "" if chosen else " (the site's: a slurm-preempt watcher of the admins may serve your jobs)"
        raise ConfigError(
            f"{user} cannot write the state folder {folder}{site} ({exc.strerror}): set state_dir in "
            "~/.config/slurm-preempt/config.toml to a folder of yours on shared storage (job scripts made "
            "by `slurm-preempt sbatch` read the same setting)"
        ) from None
