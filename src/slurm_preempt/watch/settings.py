"""The watcher's settings: the ``[watch]`` config section, its defaults, and building a watcher from it
and command-line overrides.

Everything is checked here, at start: a bad key, a bad regex, a missing token or a URL that is not
http(s) fails with one clear line before the first poll, never later in the loop.
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt import config as configmod
from slurm_preempt.errors import ConfigError, SlurmError, UsageError
from slurm_preempt.notice import DEFAULT_GRACE_SECONDS
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.watch.actions import Emit
from slurm_preempt.watch.lease import Lease
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

KNOWN_SOURCES = ("slurm", "together", "aws", "gcp")
# Every key of the [watch] section with its default: the one place a default is written.
DEFAULTS: dict[str, Any] = {
    "interval": 5.0,
    "sidecar_interval": 5.0,  # a modest rate: every job of a user runs one
    "grace": DEFAULT_GRACE_SECONDS,
    "feature": "preemptible",
    "reasons": [r"^TogetherPreemptionNotified"],
    "exclude_reasons": [],
    "enforce": False,
    "enforce_margin": 30.0,
    # A job allocated moments ago may not have installed its trap yet: its notice is written at once,
    # its signal waits for the first poll this long after its start (squeue's StartTime, whole seconds:
    # at least 2 s after the allocation). Its deadline does not move.
    "signal_after_start": 3.0,
    "fast_restart": True,
    "fallback": True,
    "max_backoff": 60.0,
    "slurm_timeout": 15.0,
    "crash_after": 3,
    "lease_ttl": 30.0,
    "sources": ["slurm"],
    "api_base_url": DEFAULT_TOGETHER_BASE,
    "cluster_id": "",
    "api_token_env": "TOGETHER_API_KEY",
    "api_token_file": "",
    "api_timeout": 5.0,
    "node_name_pattern": "",
    "node_name_template": "",
    "aws_metadata_url": AWS_BASE,
    "gcp_metadata_url": GCP_BASE,
    "metadata_timeout": 2.0,
}


def _default_rules() -> DrainRules:
    return DrainRules.from_strings(DEFAULTS["feature"], DEFAULTS["reasons"], DEFAULTS["exclude_reasons"])


@dataclass
class Settings:
    """What a watcher does, checked; the defaults are those of ``DEFAULTS``."""

    grace: float = DEFAULTS["grace"]
    interval: float = DEFAULTS["interval"]
    rules: DrainRules = field(default_factory=_default_rules)
    enforce: bool = DEFAULTS["enforce"]
    enforce_margin: float = DEFAULTS["enforce_margin"]
    signal_after_start: float = DEFAULTS["signal_after_start"]
    fast_restart: bool = DEFAULTS["fast_restart"]
    fallback: bool = DEFAULTS["fallback"]
    max_backoff: float = DEFAULTS["max_backoff"]
    slurm_timeout: float = DEFAULTS["slurm_timeout"]
    crash_after: int = DEFAULTS["crash_after"]
    lease_ttl: float = DEFAULTS["lease_ttl"]

    def validate(self) -> None:
        numbers = {"grace": self.grace, "interval": self.interval, "enforce_margin": self.enforce_margin,
                   "signal_after_start": self.signal_after_start, "max_backoff": self.max_backoff,
                   "slurm_timeout": self.slurm_timeout, "lease_ttl": self.lease_ttl}  # fmt: skip
        bad = [key for key, value in numbers.items() if not math.isfinite(value)]
        if bad:  # nan polled in a busy loop, inf crashed the loop's wait
            raise ConfigError(f"[watch] {', '.join(bad)} must be a finite number of seconds")
        if self.grace < 0 or self.enforce_margin < 0 or self.signal_after_start < 0:
            raise UsageError("grace, enforce margin and signal_after_start must be >= 0 seconds")
        if self.interval <= 0 or self.slurm_timeout <= 0:
            raise UsageError("the poll interval and the Slurm timeout must be > 0 seconds")
        if self.crash_after < 1:
            raise ConfigError("[watch] crash_after must be 1 or more")
        # The holder cannot beat while it waits for one Slurm command: a shorter lease would pass to
        # the standby whenever Slurm is slow.
        if self.lease_ttl <= self.slurm_timeout:
            raise ConfigError(
                f"[watch] lease_ttl ({self.lease_ttl:g}) must be longer than "
                f"slurm_timeout ({self.slurm_timeout:g})"
            )


def merged(section: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults, then the config file, then the command line (None means "not given")."""
    unknown = sorted(set(section) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"[watch] unknown key(s): {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    values = {**DEFAULTS, **section}
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("sources", "reasons", "exclude_reasons"):
        if isinstance(values[key], str):
            values[key] = [values[key]]
        if not isinstance(values[key], list) or not all(isinstance(v, str) for v in values[key]):
            raise ConfigError(f"[watch] {key} must be a list of strings")
    return values


def settings_from(values: Mapping[str, Any]) -> Settings:
    try:
        settings = Settings(
            grace=float(values["grace"]),
            interval=float(values["interval"]),
            rules=DrainRules.from_strings(values["feature"], values["reasons"], values["exclude_reasons"]),
            enforce=bool(values["enforce"]),
            enforce_margin=float(values["enforce_margin"]),
            signal_after_start=float(values["signal_after_start"]),
            fast_restart=bool(values["fast_restart"]),
            fallback=bool(values["fallback"]),
            max_backoff=float(values["max_backoff"]),
            slurm_timeout=float(values["slurm_timeout"]),
            crash_after=int(values["crash_after"]),
            lease_ttl=float(values["lease_ttl"]),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[watch] a number is not a number: {exc}") from None
    settings.validate()
    return settings


def sources_from(values: Mapping[str, Any], local_node: str | None = None) -> list[Source]:
    """The extra sources (``slurm`` is always read). Metadata sources need ``local_node`` (sidecar)."""
    wanted = values["sources"]
    bad = [s for s in wanted if s not in KNOWN_SOURCES]
    if bad:
        raise ConfigError(f"[watch] sources: unknown {', '.join(bad)}; known: {', '.join(KNOWN_SOURCES)}")
    found: list[Source] = []
    if "together" in wanted:
        found.append(_together(values))
    for name in ("aws", "gcp"):
        if name not in wanted:
            continue
        if local_node is None:
            raise ConfigError(f"[watch] source {name} reads this machine's metadata: use it with --sidecar")
        url = _http_url(values[f"{name}_metadata_url"], f"{name}_metadata_url")
        timeout = float(values["metadata_timeout"])
        if name == "aws":
            found.append(AwsSpotSource(node=local_node, base_url=url, timeout=timeout))
        else:
            found.append(GcpPreemptedSource(node=local_node, base_url=url, timeout=timeout))
    return found


def _together(values: Mapping[str, Any]) -> TogetherSource:
    cluster_id = str(values["cluster_id"]).strip()
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", cluster_id):
        raise ConfigError("[watch] cluster_id must be set (letters, digits, - _ .) for the together source")
    token = read_token(str(values["api_token_env"]), str(values["api_token_file"]) or None)
    return TogetherSource(
        cluster_id=cluster_id,
        token=token,
        grace=float(values["grace"]),
        base_url=_http_url(values["api_base_url"], "api_base_url"),
        node_map=NodeMap.from_config(values["node_name_pattern"], values["node_name_template"]),
        timeout=float(values["api_timeout"]),
    )


def _http_url(url: str, key: str) -> str:
    if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
        raise ConfigError(f"[watch] {key} must be an http:// or https:// URL")
    return url


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
    values = merged(conf.section("watch"), overrides)
    if job_id is not None and overrides.get("interval") is None:
        values["interval"] = values["sidecar_interval"]
    settings = settings_from(values)
    slurm = Slurm(timeout=settings.slurm_timeout)
    local_node = None
    if job_id is not None:
        # Inside a job Slurm names the node in SLURMD_NODENAME (on the test cluster every host is localhost).
        local_node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    elif not allow_preemptible_host:
        refuse_preemptible_host(slurm, settings.rules.feature)
    sources = sources_from(values, local_node)
    folder = state_dir_from(conf.state_dir(), state_dir)
    path = state_path(folder, job_id, user)
    if user is not None:
        check_writable(folder, user)
    sent = load_sent(path)
    # A sidecar is alone with its job; the daemon and a user's watcher may run as a pair on two hosts.
    lease = Lease(path, settings.lease_ttl) if job_id is None else None
    return Watcher(
        slurm, settings, sent, folder, sources, emit=emit, job_id=job_id, user=user, lease=lease,
        detached=job_id is None,
    )  # fmt: skip


def check_writable(folder: Path, user: str) -> None:
    """A user's watcher writes notices and its state under ``folder``: say at start if it cannot."""
    try:
        for sub in ("notices", "watcher"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            probe = folder / sub / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{user} cannot write the state folder {folder} ({exc.strerror}): set state_dir in "
            "~/.config/slurm-preempt/config.toml to a folder of yours on shared storage (job scripts made "
            "by `slurm-preempt sbatch` read the same setting)"
        ) from None
