"""The checked description of one job script (``JobSpec``), built from config and command line.

``merge_settings`` lays the command line over the config's ``[sbatch]`` section; ``sbatch.build`` checks
every value with ``sbatch.options`` and fills in the defaults that make a job survive preemption.
Settings come from the config's ``[sbatch]`` section (site, then user), then from the command line,
which wins. Repeatable settings (``env``, ``setup``, ``sbatch``, ``resume_flag``) add up: config first.
Which keys exist, which repeat, and their defaults: ``sbatch.optiontable``, the one declaration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt.errors import ConfigError
from slurm_preempt.optin import OptIn, merge_comment
from slurm_preempt.sbatch.optiontable import CONFIG_KEYS, DEFAULTS, LIST_KEYS, SETTING_KEYS
from slurm_preempt.slurm import features

# ------------------------------------------------------------------------------------------ the spec

# On several nodes, once the command's final checkpoint is durable (its writer rank made the file named
# in SLURM_PREEMPT_SCRIPT_REQUEUES), how long the script lets srun end by itself before it ends the
# steps: torchrun's agents wait in an exit barrier (300 s) that one agent leaving on a signal never
# completes, which once held a shrinking job past its node's removal.
STEP_END_WAIT = 5


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
    def step_end_wait(self) -> int:
        return STEP_END_WAIT

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
