"""The checkpoint interval a generated script hands its command (``SLURM_PREEMPT_CHECKPOINT_INTERVAL``).

A number as given, or ``auto``: the Young/Daly interval that ``records.report.advise_interval`` (the one
place that advice is given; ``job.interval`` holds the formulas) computes from how long one checkpoint
takes and the mean time between preemptions. Both figures come from the command line or the ``[sbatch]``
config, or are learned from earlier jobs (``--learn-from JOBID``): the same figures ``slurm-preempt
report`` prints for those jobs, from the ledger and ``sacct -D`` when accounting answers. When those
jobs were told of drains, the shortest warning their notices gave (notice to deadline) is compared with
one checkpoint's duration: more than half of it is warned of (``records.leadtime``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_preempt import ids
from slurm_preempt.errors import UsageError
from slurm_preempt.records import history, leadtime, report
from slurm_preempt.records.attempts import JobHistory
from slurm_preempt.slurm.commands import Slurm

log = logging.getLogger(__name__)

AUTO = "auto"
FIGURES = {  # settings key -> (option, what it is, why an earlier job may not show it)
    "checkpoint_seconds": (
        "--checkpoint-seconds",
        "one checkpoint's duration",
        "no checkpoint with its duration recorded (the resume library records them)",
    ),
    "mtbp": (
        "--mtbp",
        "mean time between preemptions",
        "no preemption recorded, so no time between preemptions",
    ),
}


def is_auto(value: Any) -> bool:
    return value is not None and str(value).strip().lower() == AUTO


def resolve_interval(text: str, figures: Mapping[str, Any]) -> str:
    """``text`` as a positive number, or for ``auto`` the advised seconds from ``figures``
    (``checkpoint_seconds`` and ``mtbp``)."""
    if not is_auto(text):
        value = text.strip()
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value) or float(value) <= 0:
            raise UsageError(f"--checkpoint-interval {text!r}: give a positive number or auto")
        return value
    if any(figures.get(key) is None for key in FIGURES):
        raise UsageError(
            "--checkpoint-interval auto needs --checkpoint-seconds SECONDS (one checkpoint's duration) and "
            "--mtbp SECONDS (mean time between preemptions), or --learn-from JOBID (an earlier run); "
            "or give a number"
        )
    checkpoint = _seconds("--checkpoint-seconds", figures["checkpoint_seconds"])
    advice = report.advise_interval(checkpoint, _seconds("--mtbp", figures["mtbp"]))
    if advice is None:  # both figures are positive here; advise_interval answers None only otherwise
        raise UsageError("--checkpoint-interval auto: no advice for these figures; give a number")
    return str(max(1, round(float(advice["advised_seconds"]))))


def _seconds(option: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} {value!r} is not a number of seconds") from None
    if not number > 0 or number == float("inf"):
        raise UsageError(f"{option} {value}: must be more than 0 seconds")
    return number


def with_learned_figures(
    cli: Mapping[str, Any], section: Mapping[str, Any], state_dir: Path, slurm: Slurm | None = None
) -> dict[str, Any]:
    """The command line, with the figures of its ``learn_from`` jobs added where it gives none itself.

    The command line wins over what is learned, which wins over the config. A figure none of them gives
    is a one-line error that says why the jobs did not show it."""
    job_ids = [str(j).strip() for j in cli.get("learn_from") or ()]
    if not job_ids:
        return dict(cli)
    interval = cli.get("checkpoint_interval")
    if not is_auto(section.get("checkpoint_interval") if interval is None else interval):
        raise UsageError("--learn-from serves --checkpoint-interval auto: add that option")
    histories = learned_histories(job_ids, state_dir, slurm)
    learned = learned_figures(histories)
    merged, missing = dict(cli), []
    for key, (option, what, why) in FIGURES.items():
        if merged.get(key) is not None:
            continue
        if key in learned:
            merged[key] = learned[key]
        elif section.get(key) is None:
            missing.append((why, f"{option} SECONDS ({what})"))
    if missing:
        whys, options = "; ".join(m[0] for m in missing), " and ".join(m[1] for m in missing)
        raise UsageError(f"--learn-from {', '.join(job_ids)}: {whys}: give {options}")
    warn_if_slow(merged.get("checkpoint_seconds", section.get("checkpoint_seconds")), histories)
    return merged


def warn_if_slow(checkpoint_seconds: Any, histories: list[JobHistory]) -> str | None:
    """Log (and return) a warning when one checkpoint takes more than half the shortest warning the
    notices of ``histories`` gave, from the moment each was given to its deadline."""
    given = [
        ((a.deadline - a.notice_given).total_seconds(), a.notice_source or "other")
        for h in histories
        for a in h.attempts
        if a.deadline is not None and a.notice_given is not None
    ]
    if not given or checkpoint_seconds is None:
        return None
    lead, source = min(given)
    warning = leadtime.checkpoint_warning(_seconds("--checkpoint-seconds", checkpoint_seconds), lead, source)
    if warning:
        log.warning("--checkpoint-interval auto: %s", warning)
    return warning


def learned_histories(job_ids: list[str], state_dir: Path, slurm: Slurm | None = None) -> list[JobHistory]:
    """The histories of the ``--learn-from`` jobs (ledger, and ``sacct -D`` when it answers)."""
    found = []
    for job_id in job_ids:
        if not ids.is_job_name(job_id):
            raise UsageError(f"--learn-from {job_id!r} is not a Slurm job id")
        one = history.load(job_id, state_dir, slurm if slurm is not None else Slurm())
        if not one.attempts:
            raise UsageError(
                f"--learn-from {job_id}: no attempt of job {job_id} recorded in {state_dir} "
                "(are the hooks installed?)"
            )
        found.append(one)
    return found


def learned_figures(histories: list[JobHistory]) -> dict[str, float]:
    """``checkpoint_seconds`` and ``mtbp`` over these jobs, as ``slurm-preempt report`` totals them
    (each only when the jobs show it)."""
    costs = [report.job_cost(found, report.Prices()) for found in histories]
    totals = report.Report(jobs=costs).totals()
    figures = {"checkpoint_seconds": totals["checkpoint_seconds"], "mtbp": totals["mtbp_seconds"]}
    return {key: float(value) for key, value in figures.items() if value}
