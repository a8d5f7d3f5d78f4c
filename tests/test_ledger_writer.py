"""The job side's ledger writer: the events a job records, and a ledger it cannot write never stops it."""

from __future__ import annotations

import logging

from slurm_preempt import ledger
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.environment import JobEnv
from slurm_preempt.job.ledger_writer import LedgerWriter


def test_checkpoint_saved_and_requeued_events_are_recorded_and_read_back(tmp_path):
    writer = LedgerWriter.for_job(JobEnv(job_id="7", state_dir=tmp_path / "state"))
    found = CheckpointStore(tmp_path / "ckpt").save(3, b"abc")
    writer.checkpoint_saved(found, final=True)
    writer.record("requeued", step=3, event_id="e1")
    writer.record("requeued", step=3, event_id="")
    events = ledger.events(tmp_path / "state", "7")
    saved = next(e for e in events if e["kind"] == "checkpoint_saved")
    assert (saved["step"], saved["path"], saved["bytes"], saved["final"]) == (3, str(found.path), 3, True)
    assert saved["source"] == "job"
    assert writer.handled_events() == {"e1"}


def test_no_state_folder_or_no_job_records_nothing(tmp_path):
    assert LedgerWriter(None, "7").record("requeued") is None
    assert LedgerWriter(tmp_path, "").record("requeued") is None
    assert LedgerWriter(None, "7").handled_events() == set()


def test_an_unwritable_ledger_warns_once_and_never_raises(tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    writer = LedgerWriter(blocker, "7")
    with caplog.at_level(logging.WARNING, logger="slurm_preempt"):
        for _ in range(3):
            assert writer.record("requeued", step=1) is None
    assert sum("cannot write the ledger" in r.getMessage() for r in caplog.records) == 1
    assert writer.handled_events() == set()
