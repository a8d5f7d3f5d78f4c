"""slurm/priority.py: the queue's priorities, parsed from ``squeue -o "%A %Q %T %r"``. The lines below
are real (22.05, tests/test_growback_cluster.py's drill: the job shrunk to 2 nodes, a 3-node rival
pending); that drill parses the live output on every release of the test command."""

from __future__ import annotations

import logging

from slurm_preempt.slurm.priority import Queued, outranked_by, parse_queue

REAL = (
    "30015165 4294901759 RUNNING None\n"
    "30015166 4294901758 PENDING ReqNodeNotAvail, UnavailableNodes:pre[3-4]\n"
    "30015167 0 PENDING JobHeldUser\n"
)


def test_real_lines_with_a_reason_of_several_words():
    running, rival, held = parse_queue(REAL)
    assert running == Queued("30015165", 4294901759, "RUNNING", "None")
    assert rival.reason == "ReqNodeNotAvail, UnavailableNodes:pre[3-4]" and not rival.held
    assert held.held and Queued("1", 5, "PENDING", "JobHeldAdmin").held


def test_lines_that_are_not_squeues_are_refused_one_by_one(caplog):
    with caplog.at_level(logging.WARNING):
        found = parse_queue("x 1 PENDING None\n12 -1 PENDING None\n12 1\n\n13 2 PENDING Priority\n")
    assert [q.job_id for q in found] == ["13"]
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 3


def test_the_rival_is_the_highest_pending_job_at_least_as_high_not_held():
    queue = parse_queue(REAL)
    own, rival = outranked_by("30015165", queue)
    assert own is not None and rival is None  # the pending one is lower, the other held
    queue.append(Queued("9", 4294901759, "PENDING", "Resources"))  # equal: it would wait for it
    queue.append(Queued("10", 4294901800, "PENDING", "Priority"))
    assert outranked_by("30015165", queue)[1] == Queued("10", 4294901800, "PENDING", "Priority")
    assert outranked_by("404", queue) == (None, None)  # not listed: its priority is unknown
