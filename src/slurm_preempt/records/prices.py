"""Prices of an hour on-demand and on preemptible nodes, and the assumption used without them.

From ``[report]`` in the config: its keys are declared in ``ReportSettings`` (docs/report.md's table
is written from there). Without a price for a job's unit the report still compares costs: in
node-hours (an on-demand node-hour is 1) with preemptible at the discount, configured or the documented
default (a flat 50%), and labels every such figure as resting on that assumption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_preempt import keytable
from slurm_preempt.keytable import key, number

DEFAULT_DISCOUNT = 0.5  # the documented example (docs/report.md): preemptible at half the on-demand price


@dataclass(frozen=True)
class ReportSettings:
    """The ``[report]`` section, one declaration per key (``keytable``)."""

    gpu_hour_on_demand: float | None = key(None, number(0), "on-demand price of one GPU-hour")
    gpu_hour_preemptible: float | None = key(
        None, number(0), "preemptible price of one GPU-hour (wins over the discount)"
    )
    cpu_hour_on_demand: float | None = key(
        None, number(0), "on-demand price of one CPU-hour (jobs without GPUs)"
    )
    cpu_hour_preemptible: float | None = key(
        None, number(0), "preemptible price of one CPU-hour (wins over the discount)"
    )
    preemptible_discount: float = key(
        DEFAULT_DISCOUNT,
        number(0, 1),
        "preemptible = on-demand x (1 - discount) where no preemptible price is given; "
        "without prices, the comparison in node-hours assumes it",
    )

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> ReportSettings:
        """Refuses an unknown key or a bad value (ConfigError), as ``[watch]`` does."""
        values, problems = keytable.read(cls, section)
        keytable.refuse("report", cls, problems)
        return cls(**values)


@dataclass(frozen=True)
class Prices:
    gpu_on_demand: float | None = None
    gpu_preemptible: float | None = None
    cpu_on_demand: float | None = None
    cpu_preemptible: float | None = None
    discount: float = DEFAULT_DISCOUNT  # for the unpriced comparison in node-hours

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> Prices:
        given = ReportSettings.from_section(section)
        discount = given.preemptible_discount
        gpu_pre, cpu_pre = given.gpu_hour_preemptible, given.cpu_hour_preemptible
        return cls(
            gpu_on_demand=given.gpu_hour_on_demand,
            gpu_preemptible=gpu_pre
            if gpu_pre is not None
            else _discounted(given.gpu_hour_on_demand, discount),
            cpu_on_demand=given.cpu_hour_on_demand,
            cpu_preemptible=cpu_pre
            if cpu_pre is not None
            else _discounted(given.cpu_hour_on_demand, discount),
            discount=discount,
        )

    def for_unit(self, unit: str) -> tuple[float | None, float | None]:
        if unit == "GPU-hours":
            return self.gpu_preemptible, self.gpu_on_demand
        return self.cpu_preemptible, self.cpu_on_demand


def _discounted(price: float | None, discount: float) -> float | None:
    return None if price is None else price * (1 - discount)


def assumed_fraction(node_hours: float, lost_node_hours: float, discount: float) -> float | None:
    """Every node-hour run at (1 - discount) over the useful ones at the on-demand price of 1."""
    useful = node_hours - lost_node_hours
    return node_hours * (1 - discount) / useful if useful > 0 else None


def assumption(discount: float | None) -> str:
    """The label of a cost compared without prices (empty when it came from prices)."""
    if discount is None:
        return ""
    return f" (assumed: preemptible at {1 - discount:.0%} of on-demand)"
