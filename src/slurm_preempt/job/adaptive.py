"""``interval="auto"``: the checkpoint interval from this job's own saves and the live preemption rate.

Daly's interval (``job.interval``, the one formula) from two measured figures, taken again at every
save and so at every attempt:

- one checkpoint's cost: the median of this attempt's last saves, as long as each held training up
  (the whole save, or the snapshot of a background one);
- the mean time between preemptions of the job: one over the job's node count times the per-node
  rate the watcher publishes (``<state_dir>/preemption-rate.json``, ``watch/rate.py``). Without a
  pool named (``SLURM_PREEMPT_RATE_POOL``), the highest rate of any pool: the cautious reading;
- the share of its preemptions that came with no usable notice (``interval.unannounced_share``): its
  restarts and shrinks against its final checkpoints, from its own ledger, taken once per attempt.
  A job told of every preemption in time checkpoints less often, as ``simulate`` models it.

Until both are known the interval is the stated default (the seconds in
``$SLURM_PREEMPT_CHECKPOINT_INTERVAL``, else ``DEFAULT_SECONDS``); never below one measured checkpoint.
Scripts from ``slurm-preempt sbatch --checkpoint-interval auto`` export that number (Daly's from the
figures given or learned, for any program) and ``SLURM_PREEMPT_CHECKPOINT_INTERVAL_AUTO=1``, which
makes a ``Run`` with no cadence of its own adapt. Each interval taken is written to the
ledger when it differs by a tenth or more from the last one (``history`` shows them per attempt).
Standard library only.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurm_preempt import ledger
from slurm_preempt.job.environment import ENV_CHECKPOINT_INTERVAL
from slurm_preempt.job.interval import checkpoint_interval, unannounced_share
from slurm_preempt.watch.rate import read_published

log = logging.getLogger(__name__)

AUTO = "auto"
DEFAULT_SECONDS = 1800.0
ENV_AUTO = "SLURM_PREEMPT_CHECKPOINT_INTERVAL_AUTO"
ENV_POOL = "SLURM_PREEMPT_RATE_POOL"
SAVES_KEPT = 5
CHANGE_RECORDED = 0.1  # a new interval is written to the ledger when it moves by this share


def is_auto(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def from_environment(environ: Mapping[str, str]) -> float | str | None:
    """The cadence a ``Run`` given none takes: ``auto`` from an sbatch auto script, else the seconds."""
    text = environ.get(ENV_CHECKPOINT_INTERVAL)
    if environ.get(ENV_AUTO) == "1" or is_auto(text):
        return AUTO
    return _positive(text)


class AdaptiveInterval:
    """The interval in force, from the saves ``saved`` reports and the rate file of ``state_dir``."""

    def __init__(
        self,
        state_dir: Path | None,
        nodes: int,
        environ: Mapping[str, str],
        record: Callable[..., Any] = lambda *_a, **_k: None,
        history: tuple[int, int] = (0, 0),
    ):
        """``history``: (preemptions this job has had, those it saved a final checkpoint for)."""
        self.state_dir, self.nodes, self.record = state_dir, max(1, nodes), record
        self.unannounced = unannounced_share(*history)
        self.default = _positive(environ.get(ENV_CHECKPOINT_INTERVAL)) or DEFAULT_SECONDS
        self.pool = environ.get(ENV_POOL) or None
        self.costs: deque[float] = deque(maxlen=SAVES_KEPT)
        self.seconds = self.default
        self.basis: dict[str, Any] = {"basis": "default"}
        self._recorded: float | None = None

    def saved(self, seconds: float) -> float:
        """One save held training ``seconds``: take the interval again; returns the one in force."""
        if seconds >= 0:
            self.costs.append(seconds)
        return self.update()

    def update(self) -> float:
        cost = statistics.median(self.costs) if self.costs else None
        per_node_hour = self._rate()
        if cost is None or not per_node_hour:
            self.seconds, self.basis = max(self.default, cost or 0.0), {"basis": "default"}
        else:
            mtbp = 3600.0 / (per_node_hour * self.nodes)
            self.seconds = checkpoint_interval(cost, mtbp, self.unannounced) if cost > 0 else self.default
            self.basis = {
                "basis": "live rate",
                "checkpoint_seconds": round(cost, 3),
                "mtbp_seconds": round(mtbp, 1),
                "unannounced_share": round(self.unannounced, 3),
            }
        self._maybe_record()
        return self.seconds

    def _rate(self) -> float | None:
        if self.state_dir is None:
            return None
        published = read_published(self.state_dir)
        if published is None:
            return None
        rates = []
        for name, pool in published["pools"].items():
            if self.pool is not None and name != self.pool:
                continue
            try:
                rates.append(float(pool["per_node_hour"]))
            except (KeyError, TypeError, ValueError):
                continue  # one bad pool never hides the others
        usable = [r for r in rates if 0 < r < 1e6]
        return max(usable) if usable else None

    def _maybe_record(self) -> None:
        last = self._recorded
        if last is not None and abs(self.seconds - last) < CHANGE_RECORDED * last:
            return
        self._recorded = self.seconds
        log.info("checkpoint interval %.0f s (%s)", self.seconds, self.basis["basis"])
        self.record("checkpoint_interval", seconds=round(self.seconds, 1), **self.basis)


def preemption_history(state_dir: Path | None, job_id: str, restart_count: int) -> tuple[int, int]:
    """(preemptions this job has had, those it was told of in time): its restarts and shrinks, and its
    final checkpoints (one per notice it saved for), from its own ledger; the restarts alone when the
    ledger cannot be read. A final checkpoint for a time-limit warning may count: the share is clamped."""
    restarts = max(0, restart_count)
    if state_dir is None or not job_id:
        return restarts, 0
    try:
        events = ledger.events(state_dir, job_id)
    except (OSError, ValueError):
        return restarts, 0
    finals = sum(1 for e in events if e.get("kind") == "checkpoint_saved" and e.get("final") is True)
    shrinks = sum(1 for e in events if e.get("kind") == "shrunk")
    return restarts + shrinks, finals


def _positive(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < float("inf") else None
