"""What the running Slurm does to requeued jobs, for admins (``slurm-preempt hooks check``).

From the controller's own configuration (``scontrol show config``): how long a requeued job waits
before it may start again, whether expedited requeue is on, and after how many failed launches Slurm
holds a batch job. These are notes (nothing here is wrong by itself); they say what the watcher does
about each.
"""

from __future__ import annotations

import os

from slurm_preempt.admin.hooks import Finding
from slurm_preempt.errors import SlurmError
from slurm_preempt.slurm import features
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import parse_version, scheduler_parameters


def check(slurm: Slurm) -> list[Finding]:
    """Notes on the requeue settings of the controller ``slurm`` talks to."""
    conf = (slurm.env if slurm.env is not None else os.environ).get("SLURM_CONF")
    if conf and not os.access(conf, os.R_OK):  # scontrol would retry reading it for a minute
        return [Finding(True, f"requeue settings not checked: cannot read {conf}", note=True)]
    try:
        config = slurm.config()
    except SlurmError as exc:
        return [Finding(True, f"requeue settings not checked: slurmctld did not answer ({exc})", note=True)]
    return findings(config)


def findings(config: dict[str, str]) -> list[Finding]:
    """Pure: notes from ``scontrol show config`` values."""
    try:
        version: tuple[int, int] | None = parse_version(config.get("SLURM_VERSION", ""))
    except ValueError:
        version = None
    name = config.get("SLURM_VERSION", "of unknown version")
    params = scheduler_parameters(config)
    # Unlike requeue_delay (SchedulerParameters), the expedite switch is one of SlurmctldParameters
    # (Slurm 25.11's job_mgr.c reads it from slurmctld_params).
    expedite = _expedite(scheduler_parameters(config, "SlurmctldParameters"))
    return [_hold(name, version, params), *expedite, _max_batch_requeue(version, config)]


def _hold(name: str, version: tuple[int, int] | None, params: dict[str, str]) -> Finding:
    hold = features.DEFAULT_REQUEUE_HOLD_SECONDS
    if not features.has(version, features.REQUEUE_DELAY):
        text = (
            f"Slurm {name}: a requeued job waits ~{hold} s before it may start again (cred_expire + 1; "
            "SchedulerParameters=requeue_delay needs Slurm 25.11); the watcher releases slurm-preempt "
            "jobs at once with `scontrol update jobid=J starttime=now`"
        )
    elif "requeue_delay" in params:
        text = (
            f"Slurm {name}: a requeued job waits {params['requeue_delay']} + 1 s "
            "(SchedulerParameters=requeue_delay); the watcher still releases slurm-preempt jobs at once"
        )
    else:
        text = (
            f"Slurm {name}: a requeued job waits ~{hold} s (no requeue_delay in SchedulerParameters, so "
            "cred_expire + 1); the watcher releases slurm-preempt jobs at once; SchedulerParameters="
            "requeue_delay=N would shorten the wait for every job, watched or not"
        )
    return Finding(True, text, note=True)


def _expedite(params: dict[str, str]) -> list[Finding]:
    if "enable_expedited_requeue" not in params:
        return []
    return [
        Finding(
            True,
            "SlurmctldParameters=enable_expedited_requeue is on: a job submitted with --requeue=expedite "
            "restarts on other nodes without the requeue hold when its node is removed",
            note=True,
        )
    ]


def _max_batch_requeue(version: tuple[int, int] | None, config: dict[str, str]) -> Finding:
    watcher = (
        "every failed launch also holds the job: the cluster watcher moves it to standard nodes and "
        "releases it, once"
    )
    if not features.has(version, features.MAX_BATCH_REQUEUE_SETTING):
        text = (
            f"MaxBatchRequeue is fixed at {features.DEFAULT_MAX_BATCH_REQUEUE} before Slurm 23.02 and failed "
            f"launches do not count toward it; preemptions (a node set DOWN, a job's own requeue) neither; "
            + watcher
        )
    else:
        limit = config.get("MaxBatchRequeue") or str(features.DEFAULT_MAX_BATCH_REQUEUE)
        text = (
            f"MaxBatchRequeue={limit}: after {limit} failed launches Slurm holds a batch job until an "
            "operator releases it; preemptions (a node set DOWN, a job's own requeue) do not count; "
            + watcher
        )
    return Finding(True, text, note=True)
