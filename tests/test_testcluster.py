"""The local test cluster, for real: nodes, placement by feature, removal, requeue, clean stop."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from clusterutil import lift_requeue_hold, release, wait_for
from slurm_preempt.cli import main
from slurm_preempt.errors import ClusterError
from slurm_preempt.rehearsal import procs
from slurm_preempt.rehearsal import testcluster as tc

pytestmark = pytest.mark.cluster


def test_nodes_idle_with_features(cluster):
    nodes = {n.name: n for n in cluster.slurm.nodes()}
    assert {n for n in nodes if nodes[n].has_feature("preemptible")} == {
        "pre1",
        "pre2",
        "pre3",
        "pre4",
    }
    assert {n for n in nodes if nodes[n].has_feature("standard")} == {"std1", "std2"}
    assert cluster.state.ready_seconds > 0


def test_up_twice_is_safe(cluster):
    before = cluster.fresh()
    again = tc.up(cluster.spec)
    assert [p.pid for p in again.processes] == [p.pid for p in before.processes]


def _submit(cluster, *args) -> str:
    script = cluster.workdir / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    return cluster.slurm.submit(str(script), [f"--chdir={cluster.workdir}", *args])


@pytest.mark.parametrize("feature", ["preemptible", "standard"])
def test_constraint_places_job(clean_cluster, feature):
    job_id = _submit(clean_cluster, f"--constraint={feature}")
    job = clean_cluster.wait_state(job_id, "RUNNING")
    assert job.nodes[0].startswith("pre" if feature == "preemptible" else "std")


def test_drain_then_down_requeues_with_restart_count(clean_cluster):
    job_id = _submit(clean_cluster, "--constraint=preemptible", "--requeue")
    job = clean_cluster.wait_state(job_id, "RUNNING")
    node = job.nodes[0]
    clean_cluster.slurm.drain([node], "TogetherPreemptionNotified: reclaimed")
    drained = next(n for n in clean_cluster.slurm.nodes([node]))
    assert drained.draining and drained.reason == "TogetherPreemptionNotified: reclaimed"
    assert drained.reason_time is not None and drained.reason_user == "root"
    # The drain tells the job nothing: it still runs.
    assert clean_cluster.job(job_id).running
    assert clean_cluster.remove_node(node) >= 1
    requeued = clean_cluster.wait_state(job_id, "PENDING")
    assert requeued.restart_count == 1
    assert wait_for(lambda: clean_cluster.job(job_id).reason == "BeginTime", 10, what="BeginTime")
    down = next(n for n in clean_cluster.slurm.nodes([node]))
    assert down.down and down.reason == "removed"  # the DOWN's reason and time replace the drain's
    assert down.reason_time is not None and down.reason_time >= drained.reason_time
    # The owner may skip the ~121 s wait: the job runs again at once, elsewhere.
    wait_for(lambda: lift_requeue_hold(clean_cluster.slurm, job_id), 30, what="the hold lifted")
    again = clean_cluster.wait_state(job_id, "RUNNING", timeout=20)
    assert again.nodes[0] != node and again.restart_count == 1


def test_down_stops_everything_it_started(tmp_path):
    if os.geteuid() != 0:  # pragma: no cover
        pytest.skip("needs root")
    tc.check_packages(release())
    # its own ports, apart from the session cluster's (SP_TEST_PORT and up), the launch-hold cluster's
    # (+30) and the hooks cluster's (+50)
    port = int(os.environ.get("SP_TEST_PORT", "17300")) + 25
    spec = tc.ClusterSpec(directory=tmp_path / "c", standard=1, preemptible=1, port=port, slurm=release())
    state = tc.up(spec)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    slurm = state.slurm(timeout=30)
    job_id = slurm.submit(str(script), [f"--chdir={tmp_path}"])
    wait_for(lambda: (j := slurm.job(job_id)) and j.running, 20, what="job running")
    pids = [p.pid for p in state.processes]
    dead = [p.role for p in state.processes if not p.alive]
    assert not dead, f"{dead} ended before down: {_log_tails(spec.directory / 'log')}"
    assert tc.down(spec.directory) >= len(pids)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not procs.listening_under("slurmstepd", spec.directory / "spool")
    assert not procs.with_env("SP_TESTCLUSTER_DIR", str(spec.directory))
    assert tc.down(spec.directory) == 0  # twice is fine


def _log_tails(folder: Path, lines: int = 5) -> str:
    return "\n".join(
        f"{log.name}: " + " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in sorted(folder.glob("*.out"))
    )


def test_cli_bad_input(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["testcluster", "up", "--preemptible", "-1", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "negative" in result.output
    afile = tmp_path / "file"
    afile.write_text("x")
    result = runner.invoke(main, ["testcluster", "up", "--dir", str(afile)])
    assert result.exit_code == 2 and "is not a folder" in result.output
    assert "Traceback" not in result.output


def test_cli_missing_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(procs, "SYSTEM_PATH", str(tmp_path))
    result = CliRunner().invoke(main, ["testcluster", "up", "--dir", str(tmp_path / "c")])
    assert result.exit_code == 5
    assert "apt-get install" in result.output and "munge" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_status_env(cluster):
    runner = CliRunner()
    result = runner.invoke(main, ["testcluster", "status", "--dir", str(cluster.spec.directory)])
    assert result.exit_code == 0 and "pre4" in result.output
    result = runner.invoke(main, ["testcluster", "env", "--dir", str(cluster.spec.directory)])
    assert f"export SLURM_CONF={cluster.spec.conf_path}" in result.output.splitlines()
    assert f"export SLURM_PREEMPT_STATE_DIR={cluster.spec.state_dir}" in result.output.splitlines()
    result = runner.invoke(main, ["testcluster", "status", "--dir", str(Path("/nonexistent"))])
    assert result.exit_code == 1


def test_a_garbled_cluster_json_is_one_clear_error(tmp_path):
    for text in ("{not json", "{}", '{"spec": {"directory": "/x", "colour": 1}}', "[]"):
        (tmp_path / "cluster.json").write_text(text)
        with pytest.raises(ClusterError, match="cluster.json is unreadable"):
            tc.load_state(tmp_path)
    result = CliRunner().invoke(main, ["testcluster", "status", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "cluster.json is unreadable" in result.output
