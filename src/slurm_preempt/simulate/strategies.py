"""The strategies ``simulate`` compares, and the checkpoint interval each one uses.

- on-demand only: standard nodes, no preemption, no checkpoint: the reference cost.
- the seeds' plain recipe: periodic checkpoints at Daly's interval, ``--requeue``, no notice (Slurm tells
  a drained node's job nothing), and Slurm's requeue hold before it runs again.
- submitit-style: requeue on Slurm's signal. A provider's drain makes Slurm send no signal, so it loses
  what the plain recipe loses and waits as long (measured alike on the local cluster: DESIGN.md,
  "both redo ~31 steps and run again ~141 s after the drain"); its row shows that, not a guess.
- this toolkit: the watcher's notice (measured latency), a final checkpoint, the fast restart
  (measured), periodic checkpoints only against the preemptions no notice covers; with each fallback
  policy of the watcher: none, after K preemptions, after S minutes pending, the deadline
  (Uniform-Progress rule) and the cost.
- this toolkit, shrink to N (with ``--min-nodes N`` under the job's nodes): as above, and a told
  preemption of a node that is not the batch host, leaving at least N nodes, shrinks the job in place
  (job/shrink.py) instead of requeueing it; its ``Run(interval="auto")`` takes its interval again on
  the survivors (fewer nodes, fewer preemptions: a longer interval).
- this toolkit, shrink and grow-back (``--grow-back``): as above, and once a removed node's capacity
  is back the watcher tells the shrunk job, which takes a final checkpoint and requeues at full width
  (the watcher releases the requeue hold at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from slurm_preempt.job.interval import checkpoint_interval
from slurm_preempt.simulate.spec import FAST_RESTART_SECONDS, SLURM_REQUEUE_HOLD_SECONDS, JobSpec

FALLBACKS = ("after", "pending", "deadline", "cost")


@dataclass(frozen=True)
class Strategy:
    name: str
    label: str
    interval: float  # compute seconds between periodic checkpoints; inf: none
    on_demand: bool = False  # on standard nodes from the start
    notices: bool = False  # the watcher's notice and a final checkpoint
    requeue_wait: float = SLURM_REQUEUE_HOLD_SECONDS  # from leaving to running again, unpaid
    fallback: str | None = None  # one of FALLBACKS
    min_nodes: int | None = None  # shrinks in place down to this many nodes; None: never shrinks
    grow_back: bool = False  # a shrunk job requeues at full width once capacity is back
    adapts: bool = False  # takes its interval again on fewer nodes, as Run(interval="auto") does


def job_mtbp(spec: JobSpec, width: int | None = None) -> float:
    """Mean seconds between preemptions of the job's ``width`` nodes (default: all), before any jump."""
    return spec.field.mean_gap_seconds / (spec.nodes if width is None else width)


def notice_usable(spec: JobSpec) -> bool:
    """A final checkpoint fits between the notice reaching the job and the node's removal."""
    return spec.notice_latency_seconds + spec.checkpoint_seconds <= spec.notice_seconds


def recipe_interval(spec: JobSpec) -> float:
    """The interval for checkpoints that must cover every preemption."""
    return checkpoint_interval(spec.checkpoint_seconds, job_mtbp(spec))


def toolkit_interval(spec: JobSpec, width: int | None = None) -> float:
    """The interval against the preemptions that no notice covers (all of them if a final checkpoint
    does not fit in the notice): the rule a job's ``Run(interval="auto")`` follows, given the share,
    on ``width`` of its nodes (job/adaptive.py: the job's node count times the per-node rate)."""
    unannounced = spec.field.unannounced if notice_usable(spec) else 1.0
    return checkpoint_interval(spec.checkpoint_seconds, job_mtbp(spec, width), unannounced)


def strategies(spec: JobSpec) -> list[Strategy]:
    """Every strategy that applies to ``spec`` (the deadline policy only with a deadline)."""
    plain = recipe_interval(spec)
    toolkit = toolkit_interval(spec)
    found = [
        Strategy("on-demand", "on-demand only", math.inf, on_demand=True, requeue_wait=0.0),
        Strategy("plain", "seeds' plain recipe", plain),
        Strategy("submitit", "submitit-style", plain),
        Strategy("toolkit", "slurm-preempt", toolkit, notices=True, requeue_wait=FAST_RESTART_SECONDS),
    ]
    labels = {
        "after": f"slurm-preempt, fallback-after={spec.policy.fallback_after}",
        "pending": f"slurm-preempt, fallback-pending={spec.policy.fallback_pending_minutes:g}m",
        "deadline": "slurm-preempt, fallback-deadline",
        "cost": "slurm-preempt, fallback-cost",
    }
    for fallback in FALLBACKS:
        if fallback == "deadline" and spec.deadline_hours is None:
            continue
        found.append(
            Strategy(
                f"toolkit-{fallback}",
                labels[fallback],
                toolkit,
                notices=True,
                requeue_wait=FAST_RESTART_SECONDS,
                fallback=fallback,
            )
        )
    if spec.shrinks_to < spec.nodes:
        shrink = Strategy(
            "toolkit-shrink",
            f"slurm-preempt, shrink to {spec.shrinks_to}",
            toolkit,
            notices=True,
            requeue_wait=FAST_RESTART_SECONDS,
            min_nodes=spec.shrinks_to,
            adapts=True,
        )
        found.append(shrink)
        if spec.grow_back:
            found.append(
                replace(shrink, name="toolkit-grow", label=f"{shrink.label}, grow-back", grow_back=True)
            )
    return found
