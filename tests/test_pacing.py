"""Pacing of the per-step agreement: how many step boundaries pass between two exchanges."""

from __future__ import annotations

from slurm_preempt.job.pacing import Pacer


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _window(pacer: Pacer, clock: Clock, step_seconds: float) -> int:
    """Run boundaries until the next exchange; how many boundaries that took (the exchange included)."""
    count = 0
    while True:
        count += 1
        if pacer.due():
            pacer.agreed(pacer.proposal())
            clock.now += step_seconds
            return count
        clock.now += step_seconds


def test_slow_steps_exchange_at_every_boundary():
    clock = Clock()
    pacer = Pacer(seconds=0.2, clock=clock)
    assert [_window(pacer, clock, 1.0) for _ in range(5)] == [1, 1, 1, 1, 1]


def test_fast_steps_exchange_about_every_seconds_growing_by_doubling_at_most():
    clock = Clock()
    pacer = Pacer(seconds=0.2, max_every=100, clock=clock)
    windows = [_window(pacer, clock, 0.01) for _ in range(8)]  # 10 ms steps: 20 per 0.2 s
    assert windows == [1, 1, 2, 4, 8, 16, 20, 20]


def test_the_window_is_bounded_by_max_every():
    clock = Clock()
    pacer = Pacer(seconds=10.0, max_every=50, clock=clock)
    windows = [_window(pacer, clock, 0.001) for _ in range(10)]
    assert max(windows) == 50 and windows[-1] == 50


def test_steps_turning_slow_shrink_the_window_at_the_next_exchange():
    clock = Clock()
    pacer = Pacer(seconds=0.2, clock=clock)
    for _ in range(8):
        _window(pacer, clock, 0.01)
    assert pacer.every == 20
    _window(pacer, clock, 0.5)  # a window of slow steps: the next proposal is one step
    assert pacer.every == 1


def test_ranks_take_the_smallest_proposal():
    clocks = [Clock(), Clock()]
    pacers = [Pacer(seconds=0.2, clock=c) for c in clocks]
    for _ in range(6):
        for pacer in pacers:
            assert pacer.due()
        agreed = min(p.proposal() for p in pacers)  # what -max(-k) over the ranks gives
        for pacer, clock, step in zip(pacers, clocks, (0.01, 0.05), strict=True):
            pacer.agreed(agreed)
            for _ in range(agreed - 1):
                clock.now += step
                assert not pacer.due()
            clock.now += step
    assert pacers[0].every == pacers[1].every == 4  # the slower rank's 0.2 / 0.05


def test_zero_seconds_means_every_boundary():
    clock = Clock()
    pacer = Pacer(seconds=0.0, clock=clock)
    assert [_window(pacer, clock, 0.0001) for _ in range(5)] == [1] * 5
