"""Version facts: one log per attempt where Slurm expands %r (25.11+)."""

from __future__ import annotations

import pytest

from slurm_preempt.slurm import features


@pytest.mark.parametrize(
    ("pattern", "version", "expected"),
    [
        ("%x-%j.out", (26, 5), "%x-%j.%r.out"),
        ("%x-%j.out", (25, 11), "%x-%j.%r.out"),
        ("%x-%j.out", (24, 11), "%x-%j.out"),
        ("%x-%j.out", (22, 5), "%x-%j.out"),
        ("%x-%j.out", None, "%x-%j.out"),
        ("%x-%A_%a.out", (26, 5), "%x-%A_%a.%r.out"),
        ("logs/%j", (26, 5), "logs/%j.%r"),
        ("logs.d/%j", (26, 5), "logs.d/%j.%r"),
        ("run-%j-%r.log", (26, 5), "run-%j-%r.log"),
    ],
)
def test_per_attempt_output(pattern, version, expected):
    assert features.per_attempt_output(pattern, version) == expected


def test_has():
    assert features.has((26, 5), features.REQUEUE_DELAY)
    assert not features.has((24, 11), features.REQUEUE_DELAY)
    assert not features.has(None, features.REQUEUE_DELAY)
