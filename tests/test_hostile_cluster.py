"""A hostile cluster user on the real local cluster: sp-mallory's jobs share a drained node with
sp-alice's, their names and comments hold bytes of any value and forged squeue records naming alice's
other job. The root watcher (the real `slurm-preempt watch --cluster --once --json`, run as a command)
must exit 0, tell every job on the node in that one poll, act on no forged or absent job id, and leave
alice's other job alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterutil import python_for_user, wait_for, wait_signal_age
from hostileusers import ALICE, MALLORY, ensure_user
from slurm_preempt.notice import read_notice
from slurm_preempt.slurm import parse

pytestmark = pytest.mark.cluster
OPTED = "slurm-preempt:signal=USR1"
REASON = "TogetherPreemptionNotified: hostile test"
SEP = parse.SEP
# Alice's job records the USR1 it gets in a file of hers; nothing else.
RECORD = "trap 'echo usr1 >> /tmp/sp-hostile-$SLURM_JOB_ID' USR1; while true; do sleep 0.2; done"


def _sbatch(user: str, node: str, *args: str) -> str:
    argv = ["runuser", "-u", user, "--", "sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null",
            f"--nodelist={node}", *args, "--wrap", RECORD]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, check=True)
    job_id = done.stdout.decode().strip().split(";")[0]
    Path(f"/tmp/sp-hostile-{job_id}").unlink(missing_ok=True)  # an earlier cluster's job of that id
    return job_id


def _forged(job_id: str, node: str, user: str = ALICE) -> str:
    fields = [job_id, job_id, "N/A", "RUNNING", node, "0", user, "batch", "1", "1", "1", "1", "None"]
    return "\n" + SEP.join(fields) + " " + OPTED


def test_hostile_jobs_on_a_drained_node_never_steer_the_root_watcher(clean_cluster, tmp_path):
    cl = clean_cluster
    for user in (ALICE, MALLORY):
        ensure_user(user)
    victim = _sbatch(ALICE, "pre1", f"--comment={OPTED}", "-J", "victim")
    bystander = _sbatch(ALICE, "pre2", f"--comment={OPTED}", "-J", "bystander")
    hostile = [
        _sbatch(MALLORY, "pre1", "-J", "x\n--partition=batch\x1f\r\x85\u2028",
                f"--comment={OPTED}{_forged(bystander, 'pre1')}{_forged('424242', 'pre1')}"),
        _sbatch(MALLORY, "pre1", "-J", "\x1c\x1d\x1e\x0b\x0c", "--comment=slurm-preempt:fallback-after=\u00b2"
                + _forged("--partition=batch", "pre1") + _forged("../../..", "pre1")),
    ]  # fmt: skip
    # A comment set afterwards with scontrol, holding bytes that are not UTF-8 (sbatch's argv is bytes too).
    subprocess.run(
        [b"runuser", b"-u", MALLORY.encode(), b"--", b"scontrol", b"update", f"jobid={hostile[1]}".encode(),
         b"comment=\xff\xfe" + _forged(bystander, "pre1").encode() + b"\xff"],
        check=True, capture_output=True,
    )  # fmt: skip
    for job_id in [victim, bystander, *hostile]:
        cl.wait_state(job_id, "RUNNING", timeout=60)
        wait_signal_age(cl.slurm, job_id)  # or its signal waits for a later poll (this is one poll)
    cl.slurm.drain(["pre1"], REASON)

    state = tmp_path / "state"
    argv = [sys.executable, "-m", "slurm_preempt", "watch", "--cluster", "--once", "--json",
            "--allow-preemptible-host", "--state-dir", str(state)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, env=os.environ.copy(), timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in done.stderr
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    acted = {e["job_id"] for e in lines if "job_id" in e}
    assert acted == {victim, *hostile}  # every job on pre1 told in this one poll; nothing else

    notices = sorted(p.name for p in (state / "notices").iterdir())
    assert notices == sorted(f"{j}.json" for j in (victim, *hostile))
    assert read_notice(state / "notices" / f"{victim}.json").node == "pre1"
    assert not list(tmp_path.glob("**/*partition*")) and not Path(str(state) + "/../../...json").exists()
    after = cl.slurm.job(bystander)
    assert after.state == "RUNNING" and after.nodes == ("pre2",) and after.restart_count == 0
    assert not Path(f"/tmp/sp-hostile-{bystander}").exists()  # never signalled
    wait_for(lambda: Path(f"/tmp/sp-hostile-{victim}").exists(), 30, what="the victim's USR1")
    assert cl.slurm.job("424242") is None
    signalled = {e["job_id"] for e in lines if e.get("event") == "signal_sent"}
    assert signalled == {victim, hostile[0]}  # the two that opted in; mallory's second did not


def _plant_sender(folder: Path, marker: Path) -> None:
    """A user's `slurm_preempt/watch/sender.py` in a folder they can write (issue 28 item 5)."""
    package = folder / "slurm_preempt" / "watch"
    package.mkdir(parents=True)
    for init in (package.parent / "__init__.py", package / "__init__.py"):
        init.write_text("")
    (package / "sender.py").write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")


def test_a_flooded_folder_a_fifo_notice_and_a_planted_sender_steer_nothing(clean_cluster, tmp_path):
    """Issue 28, as sp-mallory would act: her job's ledger folder (hers, as the prolog leaves it) holds
    10,000 files of 63 KB named like the watcher's own signal records, her notice is a FIFO, and the
    admin starts the root watcher from a folder where she planted `slurm_preempt/watch/sender.py`. One
    poll of the real `watch --cluster --once --json` still tells every job on the drained nodes, her own
    included (her folder is unreadable, not a reason to skip her), and never runs her code."""
    cl = clean_cluster
    alice, _ = ensure_user(ALICE)
    mallory, _ = ensure_user(MALLORY)
    victims = [
        _sbatch(ALICE, node, f"--comment={OPTED}", "-J", "victim") for node in ("pre1", "pre2", "pre1")
    ]
    hers = _sbatch(MALLORY, "pre1", f"--comment={OPTED}", "-J", "flood")
    for job_id in [*victims, hers]:
        cl.wait_state(job_id, "RUNNING", timeout=60)
        wait_signal_age(cl.slurm, job_id)
    state = tmp_path / "state"
    for job_id, uid in [*((v, alice) for v in victims), (hers, mallory)]:
        folder = state / "jobs" / job_id
        folder.mkdir(parents=True, mode=0o700)
        os.chown(folder, uid, uid)  # what the prolog does
    flood = state / "jobs" / hers
    pad = json.dumps({"kind": "signal_sent", "job_id": hers, "p": [{}] * 15_740}).encode()
    (flood / "0-x-1-signal_sent.json").write_bytes(pad)
    os.chown(flood / "0-x-1-signal_sent.json", mallory, mallory)
    for index in range(1, 10_000):
        os.link(flood / "0-x-1-signal_sent.json", flood / f"{index}-x-1-signal_sent.json")
    (state / "notices").mkdir()
    os.mkfifo(state / "notices" / f"{hers}.json")
    os.chown(state / "notices" / f"{hers}.json", mallory, mallory)
    workdir, marker = tmp_path / "admin-cwd", tmp_path / "planted-ran"
    _plant_sender(workdir, marker)
    cl.slurm.drain(["pre1", "pre2"], REASON)

    argv = [str(Path(sys.executable).parent / "slurm-preempt"), "watch", "--cluster", "--once", "--json",
            "--allow-preemptible-host", "--state-dir", str(state)]  # fmt: skip
    # The console script (as systemd starts it) puts its own folder first on sys.path, not the working
    # directory; the signal helper it starts is `python -m`, which would put that directory first.
    done = subprocess.run(
        argv, capture_output=True, env=os.environ.copy(), cwd=workdir, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    signalled = {e["job_id"] for e in lines if e.get("event") == "signal_sent"}
    assert signalled == {*victims, hers}
    assert not marker.exists()
    assert b"not read" in done.stderr  # her folder said unreadable, once, in the log
    for job_id in victims:
        wait_for(lambda j=job_id: Path(f"/tmp/sp-hostile-{j}").exists(), 30, what=f"job {job_id}'s USR1")
        assert read_notice(state / "notices" / f"{job_id}.json").node in ("pre1", "pre2")
    assert read_notice(state / "notices" / f"{hers}.json").node == "pre1"  # replaced, never read as a FIFO


def _shrink_as_mallory(job_id: str, batch_host: str, notice: Path) -> tuple[int, dict]:
    """`slurm-preempt resume shrink` run by sp-mallory with an environment she made up."""
    python, pythonpath = python_for_user(MALLORY)  # this venv's interpreter may sit under /root
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURMD_NODENAME": batch_host, "PYTHONPATH": pythonpath,
           "SLURM_PREEMPT_NOTICE": str(notice), "SLURM_PREEMPT_STATE_DIR": "/nonexistent"}  # fmt: skip
    argv = ["runuser", "-u", MALLORY, "--", python, "-m", "slurm_preempt", "resume", "shrink",
            "--min-nodes", "1", "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, env=env, cwd="/tmp", timeout=120, check=False)
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert done.stdout, done.stderr.decode(errors="replace")[-2000:]
    return done.returncode, json.loads(done.stdout)


def test_a_user_cannot_shrink_another_users_job_nor_name_nodes_not_hers(clean_cluster):
    """The shrink runs with the rights of whoever runs it (the job's owner; root never shrinks a job):
    sp-mallory pointing it at sp-alice's job is refused by Slurm, and a notice of hers naming alice's
    node leaves her own job as it is. Neither job changes."""
    cl = clean_cluster
    for user in (ALICE, MALLORY):
        ensure_user(user)
    victim = _sbatch(ALICE, "pre[1-2]", "--nodes=2", "-J", "victim")
    own = _sbatch(MALLORY, "pre[3-4]", "--nodes=2", "-J", "own")
    for job_id in (victim, own):
        cl.wait_state(job_id, "RUNNING", timeout=60)
    notice = Path(f"/tmp/sp-forged-notice-{os.getpid()}.json")
    try:
        forged = {"job_id": victim, "node": "pre2", "reason": REASON, "source": "slurm", "restart_count": 0,
                  "drain_time": "2026-12-01T06:00:00Z", "detected_at": "2026-12-01T06:00:00Z",
                  "deadline": "2099-12-01T06:05:00Z"}  # fmt: skip
        notice.write_text(json.dumps(forged))
        notice.chmod(0o644)
        code, said = _shrink_as_mallory(victim, "pre1", notice)
        # Slurm's answer to an update by someone who is neither the owner nor an operator
        # (src/slurmctld/job_mgr.c, update_job: ESLURM_USER_ID_MISSING).
        assert code == 1 and not said["shrunk"] and "Invalid user id" in said["why_not"], said
        notice.write_text(json.dumps({**forged, "job_id": own}))  # alice's node, in a notice of hers
        code, said = _shrink_as_mallory(own, "pre3", notice)
        assert code == 1 and "no node of this job is leaving" in said["why_not"], said
    finally:
        notice.unlink(missing_ok=True)
    assert cl.slurm.job(victim).nodes == ("pre1", "pre2") and cl.slurm.job(own).nodes == ("pre3", "pre4")
