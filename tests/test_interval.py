"""Young/Daly checkpoint intervals."""

from __future__ import annotations

import math

import pytest

from slurm_preempt.job.interval import daly, expected_waste, observed_mtbi, young_daly


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
