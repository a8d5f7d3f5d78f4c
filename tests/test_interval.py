"""Young/Daly checkpoint intervals."""

from __future__ import annotations

import math

import pytest

from slurm_preempt.job.interval import (
    checkpoint_interval,
    daly,
    expected_waste,
    observed_mtbi,
    unannounced_share,
    young_daly,
)


def test_young_is_the_square_root_of_twice_cost_times_mtbi():
    assert young_daly(90, 14400) == pytest.approx(math.sqrt(2 * 90 * 14400))
    assert young_daly(0, 100) == 0


def test_daly_is_close_to_young_when_checkpoints_are_cheap():
    young, higher = young_daly(1, 1e6), daly(1, 1e6)
    assert abs(higher - young) / young < 0.01


def test_daly_matches_its_formula_and_caps_at_mtbi():
    c, m = 90.0, 14400.0
    r = c / (2 * m)
    assert daly(c, m) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c)
    assert daly(300, 100) == 100


def test_young_minimises_the_first_order_waste():
    c, m = 60.0, 3600.0
    best = young_daly(c, m)
    assert expected_waste(best, c, m) < expected_waste(best * 0.7, c, m)
    assert expected_waste(best, c, m) < expected_waste(best * 1.4, c, m)


def test_observed_mtbi():
    assert observed_mtbi(36000, 4) == 9000
    assert observed_mtbi(36000, 0) is None


@pytest.mark.parametrize("c, m", [(-1, 10), (1, 0), (1, float("inf"))])
def test_bad_values_are_refused(c, m):
    with pytest.raises(ValueError):
        young_daly(c, m)


def test_the_one_interval_rule_is_dalys_against_the_unannounced_preemptions():
    assert checkpoint_interval(60, 1800) == pytest.approx(daly(60, 1800))
    assert checkpoint_interval(60, 1800, 0.05) == pytest.approx(daly(60, 1800 / 0.05))
    assert checkpoint_interval(60, 1800, 0.0) == math.inf  # every preemption announced: none needed
    assert checkpoint_interval(100, 100) == 100  # never below one checkpoint's cost
    assert checkpoint_interval(0, 100) == 1.0  # nor below one second


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError):
        checkpoint_interval(60, 1800, share)


def test_the_unannounced_share_starts_cautious_and_follows_the_jobs_own_notices():
    assert unannounced_share(0, 0) == 1.0
    assert unannounced_share(3, 3) == 0.25
    assert unannounced_share(3, 0) == 1.0
    assert unannounced_share(2, 5) == 1 / 3  # a final checkpoint for a time-limit warning: clamped
    assert unannounced_share(19, 19) == 0.05
