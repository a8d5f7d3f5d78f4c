"""The opt-in tokens of a job comment: what a user writes is parsed, never trusted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_preempt import optin


def test_unicode_digits_and_huge_numbers_are_ignored_not_raised():
    """Finding 1: "²".isdigit() is true and int("²") raised, for every job on the drained node."""
    for value in ("²", "٣", "1²", "9" * 5000, "-3", "0", ""):
        wish = optin.parse(f"slurm-preempt:fallback-after={value} slurm-preempt:fallback-pending={value}")
        assert wish.opted_in and wish.fallback_after is None and wish.fallback_pending is None


def test_our_tokens_come_first_and_survive_a_long_comment():
    merged = optin.merge_comment("x" * 5000, optin.OptIn(opted_in=True, signal="USR1", fallback_after=3))
    assert optin.parse(merged[:512]).signal == "USR1" and optin.parse(merged[:512]).fallback_after == 3


@given(st.text(max_size=2000))
def test_any_comment_parses(comment):
    wish = optin.parse(comment)
    assert wish.signal in (None, *optin.SIGNALS)
    assert wish.fallback_to == "standard" or optin._CONSTRAINT.match(wish.fallback_to)
