"""The checked description of one job script (``JobSpec``), built from config and command line.

``merge_settings`` lays the command line over the config's ``[sbatch]`` section; ``build_spec`` checks
every value with ``sbatch.options`` and fills in the defaults that make a job survive preemption.
Settings come from the config's ``[sbatch]`` section (site, then user), then from the command line,
which wins. Repeatable settings (``env``, ``setup``, ``sbatch``, ``resume_flag``) add up: config first.
Which keys exist, which repeat, and their defaults: ``sbatch.optiontable``, the one declaration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slurm_preempt.errors import ConfigError, UsageError
from slurm_preempt.optin import MAX_MARGIN_PERCENT, OptIn, merge_comment, parse_deadline
from slurm_preempt.sbatch.auto_interval import is_auto, resolve_interval
from slurm_preempt.sbatch.options import (
    ARRAY_RE,
    CONSTRAINT_RE,
    FORWARD_SIGNALS,
    GPUS_RE,
    GRES_RE,
    MEM_RE,
    NOTICE_SIGNALS,
    PLAIN_WORD_RE,
    check_arg,
    check_line,
    check_mail_type,
    check_pattern,
    parse_env,
    parse_nodes,
    parse_passthrough,
    parse_signal,
    parse_time,
    positive_int,
)
from slurm_preempt.sbatch.optiontable import CONFIG_KEYS, DEFAULTS, LIST_KEYS, SETTING_KEYS
from slurm_preempt.slurm import features

# ------------------------------------------------------------------------------------------ the spec


@dataclass
class JobSpec:
    """Everything a template needs, each value checked."""

    template: str
    command: list[str]
    job_name: str
    constraint: str | None = DEFAULTS["constraint"]
    nodes: str | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: str | None = None
    gres: str | None = None
    mem: str | None = None
    time: str | None = None
    time_seconds: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    output: str = DEFAULTS["output"]
    error: str | None = None
    mail_user: str | None = None
    mail_type: str | None = None
    chdir: str | None = None
    array: str | None = None
    env: list[tuple[str, str]] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    extra: list[tuple[str, str | None]] = field(default_factory=list)
    user_comment: str = ""
    optin: OptIn = field(default_factory=lambda: OptIn(opted_in=True, signal=DEFAULTS["notice_signal"]))
    forward_signal: str | None = DEFAULTS["forward_signal"]
    timelimit_notice: int | None = None
    checkpoint_dir: str = ""
    checkpoint_interval: str | None = None
    checkpoint_interval_auto: bool = False  # Run adapts it to the live rate (job/adaptive.py)
    resume_flags: list[str] = field(default_factory=list)
    sidecar: bool = False
    lightning: bool = False  # the command under srun, the notice forwarded as Lightning's SIGUSR1
    shrink: bool = DEFAULTS["shrink"]
    grace: int = DEFAULTS["grace"]
    nproc_per_node: int = 1
    rdzv_port: int = DEFAULTS["rdzv_port"]
    torchrun: str = "torchrun"
    slurm_version: tuple[int, int] | None = None  # the cluster's release, when known (--slurm-version)
    expedite: bool = False  # --requeue=expedite (25.11+)
    torchrun_no_python: bool = False  # the command starts with a Python interpreter

    @property
    def per_attempt_logs(self) -> bool:
        """One log per attempt (``%r`` in the file name), which Slurm expands from 25.11."""
        return "%r" in self.output and features.has(self.slurm_version, features.RESTART_IN_FILE_NAMES)

    @property
    def shrink_min_nodes(self) -> int | None:
        """MIN of ``--nodes=MIN-MAX`` when the job may go on without leaving nodes (job/shrink.py)."""
        low, _, high = (self.nodes or "").partition("-")
        if not (self.shrink and high and int(low) < int(high)):
            return None
        return int(low)

    @property
    def several_nodes(self) -> bool:
        """``--nodes`` allows more than one: the script, not the command, requeues (job/requeue.py)."""
        return int((self.nodes or "1").rpartition("-")[2]) > 1

    @property
    def notice_signal(self) -> str | None:
        return self.optin.signal

    @property
    def comment(self) -> str:
        return merge_comment(self.user_comment, self.optin)

    @property
    def trap_signals(self) -> list[str]:
        """Signals the batch shell treats as a notice: the watcher's, and the time-limit warning's."""
        signals = [self.notice_signal] if self.notice_signal else []
        if self.timelimit_notice and self.timelimit_signal not in signals:
            signals.append(self.timelimit_signal)
        return signals

    @property
    def timelimit_signal(self) -> str:
        return self.notice_signal or "USR1"

    def sbatch_options(self) -> list[tuple[str, str | None]]:
        """The ``#SBATCH`` options in order, values unquoted (the renderer quotes them)."""
        opts: list[tuple[str, str | None]] = [("job-name", self.job_name)]
        for name, value in (
            ("partition", self.partition),
            ("account", self.account),
            ("qos", self.qos),
            ("time", self.time),
            ("nodes", self.nodes),
            ("ntasks-per-node", self.ntasks_per_node),
            ("cpus-per-task", self.cpus_per_task),
            ("gpus-per-node", self.gpus_per_node),
            ("gres", self.gres),
            ("mem", self.mem),
            ("constraint", self.constraint),
            ("array", self.array),
            ("chdir", self.chdir),
        ):
            if value is not None:
                opts.append((name, str(value)))
        requeue = "expedite" if self.expedite else None
        opts += [("requeue", requeue), ("open-mode", "append"), ("output", self.output)]
        if self.error:
            opts.append(("error", self.error))
        if self.timelimit_notice:
            # B: signals only the batch shell, which turns it into a final checkpoint and a requeue.
            opts.append(("signal", f"B:{self.timelimit_signal}@{self.timelimit_notice}"))
        if self.mail_user:
            opts.append(("mail-user", self.mail_user))
        if self.mail_type:
            opts.append(("mail-type", self.mail_type))
        opts.append(("comment", self.comment))
        return opts + list(self.extra)


def merge_settings(config_section: Mapping[str, Any], cli: Mapping[str, Any]) -> dict[str, Any]:
    """Config ``[sbatch]`` values overridden by the options given on the command line."""
    strays = sorted(set(cli) - SETTING_KEYS)
    if strays:  # a caller's mistake, not a user's: every command-line option is in the table
        raise ValueError(f"not settings of slurm-preempt sbatch: {', '.join(strays)}")
    unknown = sorted(set(config_section) - CONFIG_KEYS)
    if unknown:
        raise ConfigError(
            f"[sbatch] has unknown keys {', '.join(unknown)}; known: {', '.join(sorted(CONFIG_KEYS))}"
        )
    merged: dict[str, Any] = {}
    for key, value in config_section.items():
        merged[key] = _config_list(key, value) if key in LIST_KEYS else value
    for key, value in cli.items():
        if key in LIST_KEYS:
            merged[key] = [*merged.get(key, []), *(value or ())]
        elif value is not None:
            merged[key] = value
    return merged


def _config_list(key: str, value: Any) -> list[str]:
    if key == "env" and isinstance(value, Mapping):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ConfigError(f"[sbatch] {key} must be a list of strings")
    return [str(v) for v in value]


def default_job_name(command: list[str]) -> str:
    """``python train.py`` -> ``train``; a safe word for names and checkpoint folders."""
    words = [Path(w).name for w in command if w and not w.startswith("-")]
    skip = {"python", "python3", "bash", "sh", "srun", "env", "uv", "run"}
    chosen = next(
        (w for w in words if w not in skip and not w.startswith("python")), words[0] if words else "job"
    )
    stem = chosen.rsplit(".", 1)[0] if "." in chosen[1:] else chosen
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "job"
    return safe[:64]


def path_component(name: str) -> str:
    """A job name made safe as one folder name (no separators, no leading dot)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "job"


# ------------------------------------------------------------------------------------------ building


def build_spec(settings: Mapping[str, Any], command: list[str], home: Path | None = None) -> JobSpec:
    """A checked JobSpec from merged settings (see ``merge_settings``) and the command's argv."""
    s = dict(settings)
    command = [check_arg("command argument", str(a)) for a in command]
    template = str(s.get("template") or ("array" if s.get("array") else "plain"))
    if not command:
        raise UsageError("no command given: put it after --, e.g. slurm-preempt sbatch -- python train.py")
    job_name = check_line("--job-name", s.get("job_name") or default_job_name(command))
    spec = JobSpec(template=template, command=command, job_name=job_name)
    spec.slurm_version = parse_slurm_version(s.get("slurm_version"))
    _resources(spec, s)
    _placement(spec, s)
    _preemption(spec, s)
    _checkpointing(spec, s, job_name, home or Path.home())
    _torchrun(spec, s)
    _lightning(spec, s)
    _check_template_fit(spec)
    return spec


def _lightning(spec: JobSpec, s: dict) -> None:
    """Lightning's SLURM support acts only when its process runs under srun (it says "The `srun`
    command is available on your system but is not used" otherwise and installs no requeue handler)
    with SLURM_NTASKS = devices x nodes; its requeue signal is SIGUSR1 by default."""
    if not s.get("lightning"):
        return
    spec.lightning = True
    if s.get("forward_signal") is None:
        spec.forward_signal = "USR1"
    per_node = spec.ntasks_per_node or 1
    srun_args: list[str] = []
    low, _, high = (spec.nodes or "").partition("-")
    if high and int(low) < int(high):
        # sbatch's --ntasks-per-node with --nodes=MIN-MAX asks for MIN x N tasks, and Slurm then allocates
        # MIN nodes only (seen on 22.05). On srun it still exports SLURM_NTASKS_PER_NODE, without which
        # Lightning refuses a step of more than one task ("You set `--ntasks=3` ...").
        spec.ntasks_per_node = None
        srun_args = ["--ntasks-per-node", str(per_node)]
    else:
        spec.ntasks_per_node = per_node
    if spec.command[0].rsplit("/", 1)[-1] != "srun":
        spec.command = ["srun", *srun_args, *spec.command]
    else:  # the user's own srun options come after ours, and win
        spec.command = [spec.command[0], *srun_args, *spec.command[1:]]


def _expedite(wanted: bool, version: tuple[int, int] | None) -> bool:
    """``--requeue=expedite`` only where sbatch knows it: before 25.11 it refuses the whole script."""
    if wanted and not features.has(version, features.EXPEDITED_REQUEUE):
        known = f"Slurm {version[0]}.{version[1]:02d}" if version else "an unknown release (--slurm-version)"
        raise UsageError(f"--expedite needs Slurm 25.11 or later; this cluster runs {known}")
    return wanted


def parse_slurm_version(value: Any) -> tuple[int, int] | None:
    """``26.05`` (or (26, 5), or ``slurm-wlm 26.05.5``) -> (26, 5); empty or ``none`` -> None."""
    if value is None or value == "" or str(value).lower() in ("none", "unknown"):
        return None
    if isinstance(value, tuple):
        return (int(value[0]), int(value[1]))
    match = re.search(r"(\d+)\.(\d+)", str(value))
    if match is None:
        raise UsageError(f"--slurm-version {value!r} is not a Slurm release like 24.11 or 26.05")
    return int(match.group(1)), int(match.group(2))


def _resources(spec: JobSpec, s: dict) -> None:
    if s.get("nodes") is not None:
        spec.nodes = parse_nodes(s["nodes"])
    for key in ("ntasks_per_node", "cpus_per_task"):
        if s.get(key) is not None:
            setattr(spec, key, positive_int("--" + key.replace("_", "-"), s[key]))
    if s.get("gpus_per_node") is not None:
        spec.gpus_per_node = check_pattern("--gpus-per-node", s["gpus_per_node"], GPUS_RE, "8 or h100:8")
    if s.get("gres"):
        spec.gres = check_pattern("--gres", s["gres"], GRES_RE, "gpu:8 or gpu:a100:2")
    if s.get("mem"):
        spec.mem = check_pattern("--mem", s["mem"], MEM_RE, "64G or 4000M")
    if s.get("time"):
        spec.time = check_line("--time", s["time"]).strip()
        spec.time_seconds = parse_time(spec.time)


def _placement(spec: JobSpec, s: dict) -> None:
    for key in ("partition", "account", "qos"):
        if s.get(key):
            setattr(spec, key, check_pattern("--" + key, s[key], PLAIN_WORD_RE, "gpu"))
    if s.get("standard"):
        spec.constraint = None
    if s.get("constraint"):
        spec.constraint = check_pattern("--constraint", s["constraint"], CONSTRAINT_RE, "preemptible&h100")
    if s.get("output"):
        spec.output = check_line("--output", s["output"])
    else:
        if spec.template == "array":
            spec.output = "%x-%A_%a.out"  # one log per task, stable across that task's requeues
        spec.output = features.per_attempt_output(spec.output, spec.slurm_version)
    if s.get("error"):
        spec.error = check_line("--error", s["error"])
    if s.get("mail_user"):
        spec.mail_user = check_line("--mail-user", s["mail_user"])
    if s.get("mail_type"):
        spec.mail_type = check_mail_type(s["mail_type"])
    if s.get("chdir"):
        spec.chdir = check_line("--chdir", s["chdir"])
    if s.get("array"):
        spec.array = check_pattern("--array", s["array"], ARRAY_RE, "0-9 or 1,3,5-7%2")
    spec.env = [parse_env(e) for e in s.get("env", [])]
    spec.setup = [_setup_line(line) for line in s.get("setup", [])]
    spec.extra = [parse_passthrough(o) for o in s.get("sbatch", [])]


def _setup_line(line: str) -> str:
    text = check_arg("--setup", str(line))
    if "\n" in text or "\r" in text:
        raise UsageError("--setup takes one shell line; repeat --setup for more lines")
    return text


def _preemption(spec: JobSpec, s: dict) -> None:
    spec.expedite = _expedite(bool(s.get("expedite")), spec.slurm_version)
    notice = parse_signal(
        "--notice-signal", s.get("notice_signal", DEFAULTS["notice_signal"]), NOTICE_SIGNALS
    )
    forward = s.get("forward_signal", DEFAULTS["forward_signal"])
    spec.forward_signal = parse_signal("--forward-signal", forward, FORWARD_SIGNALS)
    fallback_to = s.get("fallback_to") or DEFAULTS["fallback_to"]
    check_pattern("--fallback-to", fallback_to, CONSTRAINT_RE, "standard")
    spec.optin = OptIn(
        opted_in=True,
        signal=notice,
        fallback_after=_optional_int("--fallback-after", s.get("fallback_after")),
        fallback_pending=_optional_int("--fallback-pending", s.get("fallback_pending")),
        fallback_to=fallback_to,
        fast_restart=bool(s.get("fast_restart", DEFAULTS["fast_restart"])),
        fallback_deadline=_deadline(s.get("fallback_deadline")),
        fallback_storm=_optional_int("--fallback-storm", s.get("fallback_storm")),
        fallback_cost=_margin(s.get("fallback_cost")),
    )
    _grow_back(spec, s.get("grow_back"))
    if s.get("comment"):
        spec.user_comment = check_line("--comment", s["comment"])
    check_line("the job comment", spec.comment)
    if s.get("timelimit_notice") is not None:
        spec.timelimit_notice = positive_int("--timelimit-notice", s["timelimit_notice"], 1, 65535)
        if spec.time_seconds is not None and spec.timelimit_notice >= spec.time_seconds:
            raise UsageError(
                f"--timelimit-notice {spec.timelimit_notice} s is not shorter than --time {spec.time}"
            )
    spec.sidecar = bool(s.get("sidecar", DEFAULTS["sidecar"]))
    spec.shrink = bool(s.get("shrink", DEFAULTS["shrink"]))
    spec.grace = positive_int("--grace", s.get("grace", DEFAULTS["grace"]), 1)


def _grow_back(spec: JobSpec, value: Any) -> None:
    """``--grow-back SECONDS``: the window, and MAX of ``--nodes`` (Slurm shows a running job only the
    count it holds: watch/growback.py), as tokens."""
    if value is None:
        return
    low, _, high = (spec.nodes or "").partition("-")
    if not (high and int(low) < int(high)):
        raise UsageError("--grow-back needs a node range: --nodes=MIN-MAX")
    window = positive_int("--grow-back", value, 1, 10**8)
    spec.optin = replace(spec.optin, grow_back=window, max_nodes=int(high))


def _optional_int(option: str, value: Any) -> int | None:
    return None if value is None else positive_int(option, value)


def _margin(value: Any) -> int | None:
    """``--fallback-cost PERCENT``: a whole percent, 0 (dearer at all) to the token's bound."""
    return None if value is None else positive_int("--fallback-cost", value, 0, MAX_MARGIN_PERCENT)


def _checkpointing(spec: JobSpec, s: dict, job_name: str, home: Path) -> None:
    if s.get("checkpoint_dir"):
        spec.checkpoint_dir = check_line("--checkpoint-dir", s["checkpoint_dir"], directive=False)
    else:
        root = str(s.get("checkpoint_root") or home / "checkpoints")
        spec.checkpoint_dir = check_line("checkpoint_root", str(Path(root) / path_component(job_name)), False)
    interval = s.get("checkpoint_interval")
    if interval is not None:
        spec.checkpoint_interval = resolve_interval(str(interval), s)
        spec.checkpoint_interval_auto = is_auto(interval)
    spec.resume_flags = [check_arg("--resume-flag", str(f)) for f in s.get("resume_flag", [])]


def _torchrun(spec: JobSpec, s: dict) -> None:
    default_nproc = 1
    if spec.gpus_per_node and spec.gpus_per_node.split(":")[-1].isdigit():
        default_nproc = int(spec.gpus_per_node.split(":")[-1])
    spec.nproc_per_node = positive_int("--nproc-per-node", s.get("nproc_per_node") or default_nproc, 1)
    spec.rdzv_port = positive_int("--rdzv-port", s.get("rdzv_port") or DEFAULTS["rdzv_port"], 1024, 65535)
    if s.get("torchrun"):
        spec.torchrun = check_arg("--torchrun", str(s["torchrun"]))
    spec.torchrun_no_python = starts_with_python(spec.command)


_PYTHON_RE = re.compile(r"^python[0-9.]*$")


def starts_with_python(command: list[str]) -> bool:
    """``python train.py``, ``python3.11 -m pkg``, ``/opt/venv/bin/python ...``: torchrun runs its own
    Python on the first word, so given an interpreter it must be told ``--no-python``."""
    return bool(command) and bool(_PYTHON_RE.match(Path(command[0]).name))


def _check_template_fit(spec: JobSpec) -> None:
    if spec.template == "array" and not spec.array:
        raise UsageError("the array template needs --array RANGE, e.g. --array 0-9")
    if spec.array and spec.template == "torchrun":
        raise UsageError("--array does not go with the torchrun template")
    if spec.array and spec.template == "plain":
        spec.template = "array"


def _deadline(text: object) -> datetime | None:
    """``--fallback-deadline``: a UTC time to come, else a one-line UsageError."""
    if text is None:
        return None
    moment = parse_deadline(str(text).strip())
    if moment is None:
        raise UsageError(f"--fallback-deadline {text!r}: give a time as 2026-12-01T20:00:00Z (UTC)")
    if moment <= datetime.now(timezone.utc):
        raise UsageError(f"--fallback-deadline {text}: the deadline is in the past")
    return moment
