"""job/shrink.py: when a job may go on without its leaving nodes, and the environment it gets then.
The shrink itself, against Slurm, is tested on the real cluster (tests/test_multinode_cluster.py)."""

from __future__ import annotations

import shlex
import subprocess

from slurm_preempt.job.shrink import cpus_per_node, decide, refreshed_env, would_shrink

NODES = ("pre1", "pre2", "pre3")


def test_a_node_that_is_not_the_batch_host_leaves_and_min_stay_shrink():
    decision = decide(NODES, {"pre3"}, "pre1", min_nodes=2)
    assert decision.shrink and decision.survivors == ("pre1", "pre2") and decision.leaving == ("pre3",)


def test_the_batch_host_never_leaves_a_job():
    decision = decide(NODES, {"pre1"}, "pre1", min_nodes=1)
    assert not decision.shrink and "batch host pre1" in decision.why_not


def test_fewer_than_min_survivors_requeue():
    decision = decide(NODES, {"pre2", "pre3"}, "pre1", min_nodes=2)
    assert not decision.shrink and "fewer than the job's minimum of 2" in decision.why_not


def test_a_step_manager_job_requeues():
    assert not decide(NODES, {"pre3"}, "pre1", 2, stepmgr=True).shrink


def test_nodes_that_are_not_the_jobs_are_never_named():
    """A notice (or a drain) of another node leaves the job as it is: only its own nodes count."""
    decision = decide(NODES, {"std1", "pre9"}, "pre1", min_nodes=1)
    assert not decision.shrink and "no node of this job" in decision.why_not
    mixed = decide(NODES, {"std1", "pre2"}, "pre1", min_nodes=1)
    assert mixed.survivors == ("pre1", "pre3") and mixed.leaving == ("pre2",)


def test_cpus_per_node_keeps_the_survivors_counts():
    assert cpus_per_node("4(x3)", NODES, ("pre1", "pre3")) == "4(x2)"
    assert cpus_per_node("8,4(x2)", NODES, ("pre1", "pre3")) == "8,4"
    assert cpus_per_node("4(x2)", NODES, ("pre1",)) is None  # does not describe the old nodes
    assert cpus_per_node("x", NODES, ("pre1",)) is None


def test_refreshed_env_is_what_srun_needs_and_quoted():
    environ = {"SLURM_JOB_CPUS_PER_NODE": "2(x3)", "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "1(x3)"}
    lines = refreshed_env(environ, NODES, ("pre1", "pre2"))
    script = "\n".join(lines) + "\nenv"
    shown = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env=environ)
    got = dict(line.split("=", 1) for line in shown.stdout.splitlines() if line.startswith("SLURM_"))
    assert got["SLURM_JOB_NODELIST"] == got["SLURM_NODELIST"] == "pre[1-2]"
    assert got["SLURM_JOB_NUM_NODES"] == got["SLURM_NNODES"] == "2"
    assert got["SLURM_JOB_CPUS_PER_NODE"] == "2(x2)"
    assert "SLURM_NTASKS" not in got and "SLURM_TASKS_PER_NODE" not in got
    assert all(shlex.split(line) for line in lines)


class _Slurm:
    """What would_shrink asks of Slurm: the job, and which of its nodes drain."""

    def __init__(self, nodes, draining):
        self.job_nodes, self.draining = tuple(nodes), set(draining)

    def job(self, job_id):
        from slurm_preempt.slurm.parse import Job

        return Job(job_id=job_id, state="RUNNING", nodes=self.job_nodes)

    def nodes(self, names=None, states=None):
        from slurm_preempt.slurm.parse import Node

        return [Node(name=n, state="MIXED", flags=frozenset({"DRAIN"})) for n in names if n in self.draining]


def _environ(tmp_path, **more):
    return {"SLURM_JOB_ID": "7", "SLURM_PREEMPT_SCRIPT_DECIDES": "2", "SLURM_PREEMPT_BATCH_HOST": "pre1",
            "SLURMD_NODENAME": "pre3", "SLURM_PREEMPT_STATE_DIR": str(tmp_path), **more}  # fmt: skip


def test_the_writer_rank_leaves_the_job_to_the_script_only_when_it_can_shrink(tmp_path):
    """A rank on another node than the batch host judges by the batch host the script exported."""
    assert would_shrink(_environ(tmp_path), _Slurm(NODES, {"pre3"})).survivors == ("pre1", "pre2")
    host = would_shrink(_environ(tmp_path), _Slurm(NODES, {"pre1"}))
    assert not host.shrink and "batch host pre1" in host.why_not
    off = would_shrink(_environ(tmp_path, SLURM_PREEMPT_SCRIPT_DECIDES=""), _Slurm(NODES, {"pre3"}))
    assert not off.shrink


def test_a_grow_back_notice_never_shrinks_the_job(tmp_path):
    """A grow-back (watch/growback.py) names the batch host and no node leaves: the job requeues."""
    from datetime import datetime, timezone

    from slurm_preempt.notice import GROW_BACK_SOURCE, Notice, notice_path, write_notice

    now = datetime.now(timezone.utc)
    path = notice_path(tmp_path, "7")
    write_notice(path, Notice.for_drain("7", "pre1", "grow-back: 1 idle node(s), 2 -> 3 nodes",
                                        GROW_BACK_SOURCE, now, 300, now, restart_count=0))  # fmt: skip
    environ = _environ(tmp_path, SLURM_PREEMPT_NOTICE=str(path))
    decision = would_shrink(environ, _Slurm(NODES, set()))
    assert not decision.shrink and "grow-back notice" in decision.why_not
    write_notice(path, Notice.for_drain("7", "pre3", "drained", "slurm", now, 300, now, restart_count=0))
    assert would_shrink(environ, _Slurm(NODES, set())).survivors == ("pre1", "pre2")  # a drain still shrinks
