"""The checkpoint interval a generated script hands its command (``SLURM_PREEMPT_CHECKPOINT_INTERVAL``).

A number as given, or ``auto``: the Young/Daly interval that ``records.report.advise_interval`` (the one
place that advice is given; ``job.interval`` holds the formulas) computes from how long one checkpoint
takes and the mean time between preemptions. Both figures come from the command line or the ``[sbatch]``
config, or are learned from earlier jobs (``--learn-from JOBID``): the same figures ``slurm-preempt
report`` prints for those jobs, from the ledger and ``sacct -D`` when accounting answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_preempt.errors import UsageError
from slurm_preempt.records import history, report
from slurm_preempt.slurm.commands import Slurm

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
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


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
    learned = learned_figures(job_ids, state_dir, slurm)
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
    return merged


def learned_figures(job_ids: list[str], state_dir: Path, slurm: Slurm | None = None) -> dict[str, float]:
    """``checkpoint_seconds`` and ``mtbp`` over these jobs, as ``slurm-preempt report`` totals them
    (each only when the jobs show it)."""
    costs = []
    for job_id in job_ids:
        if not _JOB_ID.fullmatch(job_id):
            raise UsageError(f"--learn-from {job_id!r} is not a Slurm job id")
        found = history.load(job_id, state_dir, slurm if slurm is not None else Slurm())
        if not found.attempts:
            raise UsageError(
                f"--learn-from {job_id}: no attempt of job {job_id} recorded in {state_dir} "
                "(are the hooks installed?)"
            )
        costs.append(report.job_cost(found, report.Prices()))
    totals = report.Report(jobs=costs).totals()
    figures = {"checkpoint_seconds": totals["checkpoint_seconds"], "mtbp": totals["mtbp_seconds"]}
    return {key: float(value) for key, value in figures.items() if value}
