"""``build_spec``: a checked ``JobSpec`` from merged settings (``spec.merge_settings``) and a command.

Every value is checked with ``sbatch.options`` (a bad one is one ``UsageError`` line) and the defaults
that make a job survive preemption are filled in: resources, placement, the preemption policy (opt-in
tokens, signals, fallback, grow-back, ``--expedite``), checkpointing, torchrun and Lightning. Which keys
exist and their defaults: ``sbatch.optiontable``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slurm_preempt.errors import UsageError
from slurm_preempt.optin import MAX_MARGIN_PERCENT, OptIn, parse_deadline
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
from slurm_preempt.sbatch.optiontable import DEFAULTS
from slurm_preempt.sbatch.spec import JobSpec, default_job_name, path_component
from slurm_preempt.slurm import features


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
