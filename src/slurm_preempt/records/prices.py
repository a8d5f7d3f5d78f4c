"""Prices of an hour on-demand and on preemptible nodes, and the assumption used without them.

From ``[report]`` in the config (see docs/report.md)::

    [report]
    gpu_hour_on_demand = 2.0        # price of one GPU-hour on-demand
    preemptible_discount = 0.5      # preemptible = on-demand x (1 - discount); or give the price:
    # gpu_hour_preemptible = 1.0
    cpu_hour_on_demand = 0.05       # used for jobs without GPUs
    # cpu_hour_preemptible = 0.025

Without a price for a job's unit the report still compares costs: in node-hours (an on-demand
node-hour is 1) with preemptible at the discount, configured or the documented default (a flat 50%),
and labels every such figure as resting on that assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_preempt.errors import ConfigError

DEFAULT_DISCOUNT = 0.5  # the documented example (docs/report.md): preemptible at half the on-demand price


@dataclass(frozen=True)
class Prices:
    gpu_on_demand: float | None = None
    gpu_preemptible: float | None = None
    cpu_on_demand: float | None = None
    cpu_preemptible: float | None = None
    discount: float = DEFAULT_DISCOUNT  # for the unpriced comparison in node-hours

    @classmethod
    def from_config(cls, section: dict) -> Prices:
        def number(key):
            value = section.get(key)
            if value is None:
                return None
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"[report] {key} must be a non-negative number, not {value!r}")
            return float(value)

        discount = number("preemptible_discount")
        discount = DEFAULT_DISCOUNT if discount is None else discount
        if discount > 1:
            raise ConfigError(
                "[report] preemptible_discount is a fraction between 0 and 1 (0.5 = half price)"
            )
        gpu_od, cpu_od = number("gpu_hour_on_demand"), number("cpu_hour_on_demand")
        gpu_pre = number("gpu_hour_preemptible")
        cpu_pre = number("cpu_hour_preemptible")
        return cls(
            gpu_on_demand=gpu_od,
            gpu_preemptible=gpu_pre if gpu_pre is not None else _discounted(gpu_od, discount),
            cpu_on_demand=cpu_od,
            cpu_preemptible=cpu_pre if cpu_pre is not None else _discounted(cpu_od, discount),
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
