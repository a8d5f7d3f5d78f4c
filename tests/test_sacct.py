"""The sacct parser on output captured from real Slurm 22.05, 24.11 and 26.05
(scripts/capture-slurm-data.py --sacct: a job completed, one failed, one requeued then completed, one
whose node was removed then cancelled while requeued, one cancelled while pending)."""

from __future__ import annotations

from datetime import timezone

import pytest

from slurm_preempt.slurm import sacct

RELEASES = ("slurm-22.05", "slurm-24.11", "slurm-26.05")


@pytest.fixture(params=RELEASES)
def rows(request, data_dir) -> list[sacct.AcctRecord]:
    return sacct.parse_acct((data_dir / request.param / "sacct_attempts.txt").read_bytes())


def test_every_attempt_is_a_row_with_its_state(rows):
    states = [r.state for r in rows]
    assert states == ["COMPLETED", "FAILED", "REQUEUED", "COMPLETED", "NODE_FAIL", "CANCELLED", "CANCELLED"]
    requeued = [r for r in rows if r.job_id == rows[2].job_id]
    assert [r.state for r in requeued] == ["REQUEUED", "COMPLETED"]  # -D keeps the requeued attempt


def test_fields_are_typed(rows):
    done, failed, first = rows[0], rows[1], rows[2]
    assert done.nodes == ("pre2",) and done.num_nodes == 1 and done.cpus == 1 and done.gpus == 0
    assert done.partition == "batch" and done.user == "root" and done.constraints == "preemptible"
    assert failed.exit_code == "3:0"
    assert first.start and first.end and first.submit and first.start.tzinfo == timezone.utc
    assert rows[3].start >= first.end  # the second attempt starts after the first ended
    assert rows[4].nodes == ("pre1",)


def test_an_attempt_that_never_ran_has_no_nodes(rows):
    cancelled = rows[-1]
    assert cancelled.nodes == () and cancelled.end is not None
    # 22.05 records the cancel time as its start; 24.11 and later record none.
    assert cancelled.start is None or cancelled.start == cancelled.end


def test_rows_that_are_not_jobs_are_skipped():
    text = "\n".join(["", "garbage", "x|y", "12.batch|12|COMPLETED|0:0|||||||||", "junk|" * 13])
    assert sacct.parse_acct(text) == []


def test_a_bad_node_list_refuses_only_its_row(caplog):
    good = "7|7|COMPLETED|0:0|1796148608|1796148611|1796148611|1|pre2|batch|root||cpu=1"
    bad = "8|8|COMPLETED|0:0|1796148608|1796148611|1796148611|1|pre[1-|batch|root||cpu=1"
    assert [r.job_id for r in sacct.parse_acct("\n".join([bad, good]))] == ["7"]
    assert "sacct row refused" in caplog.text
