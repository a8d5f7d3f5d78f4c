"""`hooks check` notes on the running Slurm's requeue settings, from real `scontrol show config` output."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_preempt.admin import requeuecheck
from slurm_preempt.slurm.parse import parse_config

DATA = Path(__file__).parent / "data"


def _config(release: str, **changes: str) -> dict[str, str]:
    config = parse_config((DATA / f"slurm-{release}" / "scontrol_show_config.txt").read_text())
    config.update(changes)
    return config


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_before_25_11_the_hold_is_cred_expire(release):
    notes = requeuecheck.findings(_config(release))
    assert all(n.ok and n.note for n in notes)
    assert "waits ~121 s" in notes[0].message and "requeue_delay needs Slurm 25.11" in notes[0].message


@pytest.mark.parametrize(("release", "version"), [("25.11", "25.11.7"), ("26.05", "26.05.5")])
def test_from_25_11_without_requeue_delay_says_it_could_be_set(release, version):
    [hold, limit] = requeuecheck.findings(_config(release))
    assert f"Slurm {version}" in hold.message and "no requeue_delay" in hold.message
    assert "MaxBatchRequeue=5: after 5 failed launches" in limit.message


def test_26_05_reports_requeue_delay_and_warns_about_expedite():
    config = _config(
        "26.05",
        SchedulerParameters="bf_continue,requeue_delay=10",
        SlurmctldParameters="enable_configless,enable_expedited_requeue",
    )
    [hold, expedite, _limit] = requeuecheck.findings(config)
    assert "waits 10 + 1 s (SchedulerParameters=requeue_delay)" in hold.message
    assert "--requeue=expedite" in expedite.message and "without the requeue hold" in expedite.message


def test_expedited_requeue_is_a_slurmctld_parameter_not_a_scheduler_one():
    """Slurm reads enable_expedited_requeue from SlurmctldParameters only (25.11's job_mgr.c)."""
    config = _config("26.05", SchedulerParameters="enable_expedited_requeue")
    assert not any("expedite" in f.message for f in requeuecheck.findings(config))


def test_22_05_limit_is_fixed_and_failed_launches_do_not_count():
    limit = requeuecheck.findings(_config("22.05"))[-1]
    assert (
        "fixed at 5 before Slurm 23.02" in limit.message and "failed launches do not count" in limit.message
    )


def test_a_controller_that_does_not_answer_is_one_note(tmp_path):
    from slurm_preempt.slurm.commands import Slurm

    notes = requeuecheck.check(Slurm(env={"SLURM_CONF": str(tmp_path / "missing.conf"), "PATH": "/usr/bin"}))
    assert len(notes) == 1 and notes[0].note and "not checked" in notes[0].message
