"""The watcher's pyslurm backend on a real Slurm 25.11 cluster (the release pyslurm is built for; left
out on the others): pyslurm, built once beside the source-built root (``pyslurmbuild``), runs inside
that root (the host's glibc cannot load its libslurm), as tests/pyslurm_poll.py.

One cluster state, read by both backends in one run: sp-alice's opted-in job with a name holding a
newline, ``|`` and the CLI's separator (valid UTF-8: pyslurm reads it itself) and sp-mallory's with
bytes that are not UTF-8 in its comment (pyslurm cannot decode it: read again through the CLI) share
pre1, which is drained. Both backends must give the same records and the same decisions, and neither
may crash or let a user's text become a job or a node.

And the whole chain with the watcher daemon itself (``watch --cluster``, its loop) reading through pyslurm
inside the root: a generated job preempted, told, checkpointed, requeued, restarted at once and resumed
where it left (the CLI daemon does the same on this tier in tests/test_e2e.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterutil import SRC, release, running_watcher, submit_generated, wait_for, wait_signal_age
from hostileusers import ALICE, MALLORY, ensure_user
from preemption import GRACE, drill_runner, preempt_once, reference, resumed_where_it_left, train
from slurm_preempt.rehearsal import pyslurmbuild, versions
from slurm_preempt.rehearsal.slurmroot import RootRuntime

pytestmark = [pytest.mark.cluster, pytest.mark.pyslurm]
OPTED = "slurm-preempt:signal=USR1"
HELPER = Path(__file__).with_name("pyslurm_poll.py")
LOOP = "trap 'echo usr1 >> /tmp/sp-pyslurm-$SLURM_JOB_ID' USR1; while true; do sleep 0.2; done"


def _sbatch(user: str, node: str, *args: str | bytes) -> str:
    argv = [b"runuser", b"-u", user.encode(), b"--", b"sbatch", b"--parsable", b"--chdir=/tmp",
            b"--output=/dev/null", f"--nodelist={node}".encode(),
            *(a if isinstance(a, bytes) else a.encode() for a in args), b"--wrap", LOOP.encode()]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, check=True)
    return done.stdout.decode().strip().split(";")[0]


def _pyslurm_env(tmp_path: Path) -> dict[str, str]:
    """The environment that finds pyslurm (copied into /tmp, which the root's namespace shares: the cache
    beside the root is not) and this checkout's source, inside the release's root."""
    built = pyslurmbuild.ensure(versions.release(release()))
    copied = tmp_path / "pyslurm"
    shutil.copytree(built, copied, symlinks=True)
    return {**os.environ, "PYTHONPATH": f"{copied}{os.pathsep}{SRC}"}


def _root_argv(*args: str) -> list[str]:
    """This project's Python, with ``args``, run inside the release's root."""
    return RootRuntime(versions.release(release())).chroot_argv([sys.executable, *args])


def _in_root(tmp_path: Path, *args: str) -> dict:
    """tests/pyslurm_poll.py run inside the release's root, with pyslurm."""
    argv = _root_argv(str(HELPER), *args)
    done = subprocess.run(argv, capture_output=True, env=_pyslurm_env(tmp_path), timeout=300, check=False)
    said = done.stderr.decode(errors="replace")
    assert done.returncode == 0 and "Traceback" not in said, said[-3000:]
    return json.loads(done.stdout)


def test_both_backends_read_and_decide_alike_on_a_drained_node_with_hostile_jobs(clean_cluster, tmp_path):
    cl = clean_cluster
    for user in (ALICE, MALLORY):
        ensure_user(user)
    alice = _sbatch(ALICE, "pre1", f"--comment={OPTED} a|b", "-J", "a|b\nc\x1fd")
    mallory = _sbatch(MALLORY, "pre1", f"--comment={OPTED}", b"-J", b"m\xff\xfe|x")
    subprocess.run(
        [b"runuser", b"-u", MALLORY.encode(), b"--", b"scontrol", b"update", f"jobid={mallory}".encode(),
         b"comment=" + OPTED.encode() + b" \xff\n" + alice.encode() + b"|RUNNING|pre2"],
        check=True, capture_output=True,
    )  # fmt: skip
    for job_id in (alice, mallory):
        cl.wait_state(job_id, "RUNNING", timeout=60)
        wait_signal_age(cl.slurm, job_id)
    cl.slurm.drain(["pre1"], "TogetherPreemptionNotified: pyslurm test")

    found = _in_root(tmp_path, "compare")
    cli, pyslurm = found["cli"], found["pyslurm"]
    assert pyslurm["reads"] == cli["reads"]
    assert pyslurm["decisions"] == cli["decisions"]
    running = {job["job_id"]: job for job in pyslurm["reads"]["running"]}
    assert set(running) == {alice, mallory}  # nothing forged became a job
    assert running[alice]["name"] == "a|b\nc\x1fd" and running[alice]["nodes"] == ["pre1"]
    assert running[mallory]["name"] == "m\ufffd\ufffd|x" and "\ufffd" in running[mallory]["comment"]
    assert [n["name"] for n in pyslurm["reads"]["drained"]] == ["pre1"]
    signalled = {job for call in pyslurm["decisions"]["calls"] if call[0] == "signal" for job in call[1]}
    assert signalled == {alice, mallory}  # both opted in: told, through either backend


def test_daemon_reading_through_pyslurm_tells_requeues_and_restarts_a_preempted_job(clean_cluster, tmp_path):
    cl = clean_cluster
    expected = reference(tmp_path / "ref")
    config = tmp_path / "watch.toml"
    config.write_text('[watch]\nbackend = "pyslurm"\n')
    log = tmp_path / "watch.log"
    daemon = _root_argv("-m", "slurm_preempt")
    work = tmp_path / "job"
    result = work / "result.json"
    with running_watcher(cl, log, GRACE, ["--config", str(config)], daemon, _pyslurm_env(tmp_path)):
        # The backend is chosen once, before the loop starts: pyslurm, not the CLI fallback.
        wait_for(lambda: "watching the cluster" in log.read_text(), 60, what="the daemon's loop", log=log)
        said = log.read_text()
        assert f"reads Slurm through pyslurm {pyslurmbuild.PYSLURM[release()]}" in said, said
        assert "reading Slurm through its commands" not in said, said
        job_id = submit_generated(cl, work, ["--job-name", "pyslurm-e2e"], train(result))
        watch = preempt_once(cl, drill_runner(cl), job_id, work)
        assert watch.notified_at is not None  # the daemon's notice, in the ledger
        wait_for(result.exists, 120, what="the job's result", log=log)
        said = log.read_text()
    assert "Traceback" not in said and "pyslurm job refused" not in said, said
    assert json.loads(result.read_text())["value"] == expected
    resumed_where_it_left(cl.spec.state_dir, job_id, 1)
    print(f"pyslurm daemon: {watch.verdict(None)}")
