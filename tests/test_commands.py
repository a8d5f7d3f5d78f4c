"""slurm/commands.py: the client's version, asked with or without a slurm.conf, and Slurm's words for a job
that is gone, on the real Slurm."""

from __future__ import annotations

import os

import pytest

from slurm_preempt.errors import JobGoneError, SlurmError, UsageError
from slurm_preempt.slurm.commands import Slurm, job_gone
from slurm_preempt.slurm.parse import parse_version


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without the cluster's SLURM_CONF, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    return {**env, **extra}


def test_version_with_and_without_a_slurm_conf(cluster):
    """22.05's clients read slurm.conf before --version: without one `sinfo --version` dies with
    "Could not establish a configuration source", and a missing SLURM_CONF file makes it retry 60 s."""
    config = cluster.slurm.run(["scontrol", "show", "config"])
    line = next(ln for ln in config.splitlines() if ln.startswith("SLURM_VERSION"))
    running = parse_version(line.partition("=")[2])  # what the cluster's controller runs
    assert Slurm().version() == running  # the cluster's SLURM_CONF
    assert Slurm(env=_env()).version() == running  # none (unless this machine has /etc/slurm/slurm.conf)
    assert Slurm(env=_env(SLURM_CONF=os.devnull)).version() == running  # one that is no configuration
    assert Slurm(timeout=20, env=_env(SLURM_CONF="/nonexistent/slurm.conf")).version() == running


def test_a_version_that_cannot_be_told_is_one_line(tmp_path):
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        "#!/bin/sh\necho 'sinfo: fatal: Could not establish a configuration source' >&2\nexit 1\n"
    )
    sinfo.chmod(0o755)
    with pytest.raises(SlurmError) as caught:
        Slurm(env={"PATH": str(tmp_path)}).version()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot tell the Slurm version: `sinfo --version` failed, also with a minimal")
    assert message.endswith("sinfo: fatal: Could not establish a configuration source")


# ---------------------------------------------------------------------------------------- gone jobs

# The first two as 22.05 prints them (test_slurms_words_for_a_job_that_is_gone on the real cluster); the
# other two are Slurm's strings for ESLURM_ALREADY_DONE and ESLURM_JOB_FINISHED (src/common/slurm_errno.c)
# after scancel's prefix, seen when a job ends while it is acted on.
GONE = [
    "scancel: error: Kill job error on job id 12: Invalid job id specified",
    "Invalid job id specified for job 99999999",
    "scancel: error: Kill job error on job id 12: Job/step already completing or completed",
    "scancel: error: Kill job error on job id 12_3: Job has already finished",
]
NOT_GONE = [
    "scancel: error: Kill job error on job id 11: Access/permission denied",
    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "Job is not running",
    "",
]


@pytest.mark.parametrize("complaint", GONE)
def test_slurms_words_for_a_gone_job(complaint):
    assert job_gone(complaint)


@pytest.mark.parametrize("complaint", NOT_GONE)
def test_other_complaints_are_not_a_gone_job(complaint):
    assert not job_gone(complaint)


def test_a_gone_job_is_its_own_error_and_other_failures_are_not(tmp_path):
    for name, stderr in (("scontrol", GONE[1]), ("sbatch", NOT_GONE[0])):
        tool = tmp_path / name
        tool.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
        tool.chmod(0o755)
    slurm = Slurm(env={"PATH": str(tmp_path)})
    with pytest.raises(JobGoneError):
        slurm.requeue("99999999")
    with pytest.raises(SlurmError) as caught:
        slurm.submit(str(tmp_path / "job.sh"))
    assert not isinstance(caught.value, JobGoneError)


def test_nothing_to_cancel_runs_nothing_and_bad_names_never_reach_an_argv():
    nowhere = Slurm(env={"PATH": "/nonexistent"})  # any command run would raise SlurmNotFoundError
    nowhere.cancel_many([])
    with pytest.raises(UsageError, match="not a Slurm job id"):
        nowhere.cancel_many(["12", "--user=alice"])
    with pytest.raises(UsageError, match="not a Slurm cluster name"):
        nowhere.add_cluster("prod where name=x")
    with pytest.raises(UsageError, match="not a Slurm job id"):  # issue 28 item 7: release checked too
        nowhere.release("--help")


def test_slurms_words_for_a_job_that_is_gone(clean_cluster, tmp_path):
    """What each act of the watcher gets from the real Slurm for a job that ended (the job left the
    controller: ``scancel --signal``) or never was (every act)."""
    slurm = clean_cluster.slurm
    script = clean_cluster.workdir / "gone.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    ended = slurm.submit(str(script), [f"--chdir={clean_cluster.workdir}", "--output=/dev/null"])
    clean_cluster.wait_state(ended, "COMPLETED", timeout=60)
    never = "99999999"  # above FirstJobId's range (1000 + 30,000,000) and every id this cluster gave
    complaints = slurm.signal_many([ended, never], "USR1").splitlines()
    assert len(complaints) == 2 and all(job_gone(line) for line in complaints), complaints
    for act in (
        lambda: slurm.requeue(never),
        lambda: slurm.update_job(never, starttime="now"),
        lambda: slurm.release(never),
    ):
        with pytest.raises(JobGoneError):
            act()
    slurm.cancel_many([never])  # without --signal scancel is silent about it, and exits 0
