"""What changes between the Slurm releases slurm-preempt runs on, in one place.

Each fact names the first release that has it. The boundaries come from Slurm's source (the release
that added the code); what each supported release does was observed on the local test cluster
(22.05, 24.11, 26.05: tests/test_slurm_behaviour.py and tests/data/slurm-<release>/), and README's
table says the same.
"""

from __future__ import annotations

Version = tuple[int, int]

# `%r` (the job's restart count) in --output/--error file names: one log per attempt.
RESTART_IN_FILE_NAMES: Version = (25, 11)
# SchedulerParameters=requeue_delay=N: the hold of a requeued job (before: cred_expire + 1, ~121 s).
REQUEUE_DELAY: Version = (25, 11)
# --requeue=expedite with SlurmctldParameters=enable_expedited_requeue.
EXPEDITED_REQUEUE: Version = (25, 11)
# MaxBatchRequeue in slurm.conf, and every failed launch (a prolog that fails, a node lost while the job
# starts) counts toward it. Before: fixed at 5, and failed launches did not count (22.05: a job whose
# prolog failed 8 times was never held for it). A node set DOWN under a job never counts.
MAX_BATCH_REQUEUE_SETTING: Version = (23, 2)
DEFAULT_MAX_BATCH_REQUEUE = 5
# Slurm's hold of a requeued job when nothing shortens it: cred_expire (120 s) + 1.
DEFAULT_REQUEUE_HOLD_SECONDS = 121
# The squeue reason of a job held after MaxBatchRequeue launch failures; only an operator may release it.
MAX_REQUEUE_HOLD_REASON = "JobHoldMaxRequeue"


def has(version: Version | None, feature: Version) -> bool:
    """True when ``version`` (None: unknown) has ``feature``."""
    return version is not None and tuple(version) >= feature


def per_attempt_output(pattern: str, version: Version | None) -> str:
    """``%x-%j.out`` -> ``%x-%j.%r.out`` where Slurm expands ``%r``; unchanged elsewhere (and when the
    pattern already names the attempt). One log per attempt needs no ``--open-mode=append`` to survive
    a requeue; older releases keep one appended log, each attempt labelled by the script."""
    if not has(version, RESTART_IN_FILE_NAMES) or "%r" in pattern:
        return pattern
    stem, dot, ext = pattern.rpartition(".")
    if not dot or "/" in ext:
        return pattern + ".%r"
    return f"{stem}.%r.{ext}"
