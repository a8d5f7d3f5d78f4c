"""How often to checkpoint: Young's and Daly's optimum intervals.

With a checkpoint costing ``c`` seconds and a mean time between interruptions (preemptions) ``m``:

- Young (1974): ``sqrt(2 c m)``, good when ``c`` is much smaller than ``m``.
- Daly (2006), higher order: ``sqrt(2 c m) * (1 + sqrt(c / 2m) / 3 + (c / 2m) / 9) - c`` for ``c < 2m``,
  else ``m``.

Both return the compute time between the ends of two checkpoints, in seconds. With a notice before
each preemption the loss is smaller still; the interval bounds what is lost when no notice comes.

``checkpoint_interval`` is the one rule every part uses (a job's ``Run(interval="auto")``, ``sbatch
--checkpoint-interval auto``, ``report``'s advice and ``simulate``): Daly's interval against the
preemptions that no notice covers (a final checkpoint saves the others' work), and
``unannounced_share`` how a job estimates that share from its own attempts.
"""

from __future__ import annotations

import math


def _check(c: float, m: float) -> None:
    if c < 0 or m <= 0 or not (math.isfinite(c) and math.isfinite(m)):
        raise ValueError(f"need checkpoint cost >= 0 and MTBI > 0 (finite), got c={c}, m={m}")


def young_daly(c: float, m: float) -> float:
    """Young's first-order optimum ``sqrt(2 * c * m)`` (seconds)."""
    _check(c, m)
    return math.sqrt(2.0 * c * m)


def daly(c: float, m: float) -> float:
    """Daly's higher-order optimum (seconds); equals ``m`` when ``c >= 2m``."""
    _check(c, m)
    if c >= 2.0 * m:
        return m
    ratio = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - c


def observed_mtbi(run_seconds: float, interruptions: int) -> float | None:
    """Mean time between interruptions from history: run time divided by interruptions (None if none)."""
    if interruptions <= 0 or run_seconds <= 0:
        return None
    return run_seconds / interruptions


def expected_waste(interval: float, c: float, m: float) -> float:
    """First-order fraction of time lost to checkpoints and rework: ``c/T + T/(2m)``."""
    _check(c, m)
    if interval <= 0:
        raise ValueError("interval must be positive")
    return c / interval + interval / (2.0 * m)


MIN_INTERVAL = 1.0  # seconds: a free checkpoint still takes a step


def checkpoint_interval(checkpoint: float, mtbp: float, unannounced: float = 1.0) -> float:
    """Seconds between periodic checkpoints: Daly's interval against the preemptions that come without
    a usable notice, a share ``unannounced`` of all (``mtbp`` the mean time between all of them). Never
    below one checkpoint's cost nor ``MIN_INTERVAL``; infinite when every preemption is announced."""
    _check(checkpoint, mtbp)
    if not 0.0 <= unannounced <= 1.0:  # NaN fails too
        raise ValueError(f"need a share of unannounced preemptions in [0, 1], got {unannounced}")
    if unannounced == 0.0:
        return math.inf
    return max(daly(checkpoint, mtbp / unannounced), checkpoint, MIN_INTERVAL)


def unannounced_share(preemptions: int, announced: int) -> float:
    """The share of a job's preemptions taken to come without a usable notice, from its own history:
    ``(unannounced + 1) / (preemptions + 1)``. One unannounced preemption is assumed before any is seen,
    so a job with no history checkpoints as if no notice will come (the cautious reading), and each
    preemption it was told of in time moves its interval toward the notice-covered one."""
    preemptions = max(0, preemptions)
    announced = min(max(0, announced), preemptions)
    return (preemptions - announced + 1) / (preemptions + 1)
