"""The rate-jump drill on a real local cluster: the cluster watcher publishes the live preemption rate
of the preemptible pool from the drains it sees, and a job with ``Run(interval="auto")`` on one node
of that pool takes its checkpoint interval from it. Other nodes of the pool are drained: once, then
three at a time, a jump the watcher's test flags; the job's interval shortens at its next save and
``slurm-preempt history --json`` shows the interval before and after.

The windows are compressed through ``[watch]`` keys (``rate_jump_window``, the one source the watcher
reads), the waits are on conditions (the watcher's age as its own rate file says it, the file's
``jump`` flag, the job's ledger), never on the clock alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from clusterutil import SP, ClusterHandle, own_cluster, running_watcher, wait_for
from slurm_preempt import ledger
from slurm_preempt.notice import from_text
from slurm_preempt.watch.rate import FILE_NAME, read_published

pytestmark = pytest.mark.cluster
REASON = "TogetherPreemptionNotified: rate drill"
POOL = "preemptible"
JUMP_WINDOW = 15.0  # [watch] rate_jump_window, seconds
# Drain A comes when the watcher is FIRST_DRAIN_AGE old: its rate (1 over the pool's node-seconds
# of the watcher's age) is then a sixth of the jump's (3 drains in JUMP_WINDOW). The jump comes at
# JUMP_AGE or later: the rate before it (A's) gives the short window a mean of at most
# 15 / (60 - 15) = 0.33 drains, and 3 of them then have a chance of 0.5% (< rate.JUMP_P).
FIRST_DRAIN_AGE = 30.0
JUMP_AGE = 60.0
SAVE_SECONDS = 0.3  # the job's checkpoint cost: its state takes this long to pickle

# The job: steps of 50 ms, a checkpoint whenever the interval in force says so. Until the watcher
# publishes a rate the interval is the stated default (2 s); then Daly's from the measured save cost
# and the pool's rate, taken again at every save.
PROGRAM = """
import sys, time
from slurm_preempt.job.resume import Run

class Slow:
    def __getstate__(self):
        time.sleep({save})
        return {{}}

with Run(sys.argv[1], interval="auto") as run:
    step = run.step or 0
    while True:
        step += 1
        time.sleep(0.05)
        if run.should_checkpoint(step):
            run.save(step, {{"step": step, "slow": Slow()}})
"""
SCRIPT = """#!/bin/bash
export SLURM_PREEMPT_STATE_DIR={state}
export SLURM_PREEMPT_CONFIG={config}
export SLURM_PREEMPT_CHECKPOINT_INTERVAL=2
export SLURM_PREEMPT_RATE_POOL={pool}
exec {python} {program} {ckpt}
"""


@pytest.fixture(scope="module")
def acluster():
    with own_cluster("adaptive", standard=1, preemptible=4, cpus=8, hooks=True) as handle:
        yield handle


def _submit(cl: ClusterHandle) -> str:
    (cl.workdir / "empty.toml").write_text("")
    program = cl.workdir / "auto.py"
    program.write_text(PROGRAM.format(save=SAVE_SECONDS))
    script = cl.workdir / "auto.sh"
    script.write_text(
        SCRIPT.format(
            state=cl.spec.state_dir,
            config=cl.workdir / "empty.toml",
            pool=POOL,
            python=sys.executable,
            program=program,
            ckpt=cl.workdir / "ckpt",
        )  # fmt: skip
    )
    script.chmod(0o755)
    extra = [f"--chdir={cl.workdir}", f"--output={cl.workdir}/auto-%j.out", "--nodelist=pre1"]
    return cl.slurm.submit(str(script), [*extra, f"--constraint={POOL}"])


def _published(cl: ClusterHandle) -> dict | None:
    return read_published(cl.spec.state_dir)


def _age(cl: ClusterHandle) -> float:
    """The watcher's age by its own rate file (``since``: when it started counting)."""
    found = _published(cl)
    if not found or "since" not in found:
        return 0.0
    return (datetime.now(timezone.utc) - from_text(found["since"])).total_seconds()


def _pool(cl: ClusterHandle) -> dict | None:
    found = _published(cl)
    return found["pools"].get(POOL) if found else None


def _intervals(cl: ClusterHandle, job_id: str) -> list[dict]:
    return [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == "checkpoint_interval"]


def _saves(cl: ClusterHandle, job_id: str) -> list[dict]:
    return [e for e in ledger.events(cl.spec.state_dir, job_id) if e["kind"] == "checkpoint_saved"]


def _when(event: dict) -> float:
    return from_text(event["time"]).timestamp()


def test_the_interval_in_force_shortens_within_one_save_of_a_rate_jump(acluster, tmp_path):
    cl = acluster
    config = tmp_path / "watch.toml"
    config.write_text(f"[watch]\nrate_jump_window = {JUMP_WINDOW}\n")
    rate_file = cl.spec.state_dir / FILE_NAME
    rate_file.unlink(missing_ok=True)  # an earlier test's watcher: its times would be taken back
    job_id = _submit(cl)
    log = cl.workdir / f"auto-{job_id}.out"
    try:
        with running_watcher(cl, tmp_path / "watch.log", 300.0, ["--config", str(config)]):
            cl.wait_state(job_id, "RUNNING", 60)
            wait_for(lambda: _saves(cl, job_id), 60, what="the job's first save", log=log)
            wait_for(lambda: _age(cl) >= FIRST_DRAIN_AGE, 120, 0.5, what="the watcher's age")
            cl.slurm.drain(["pre2"], REASON)
            calm = wait_for(lambda: _pool(cl), 60, what="the pool's first rate")
            assert calm["preemptions"] == 1 and not calm["jump"], calm

            def live_interval():
                found = [e for e in _intervals(cl, job_id) if e.get("basis") == "live rate"]
                return found[-1] if found else None

            wait_for(live_interval, 60, what="the job on the live rate", log=log)
            cl.slurm.resume(["pre2"])
            wait_for(lambda: _age(cl) >= JUMP_AGE, 120, 0.5, what="the watcher's age")
            cl.slurm.drain(["pre2", "pre3", "pre4"], REASON)  # a jump: three nodes in one second

            def jumped():
                """The pool's figures and when they were written, once they show the jump."""
                written = rate_file.stat().st_mtime
                pool = _pool(cl)
                same = rate_file.stat().st_mtime == written  # not replaced while being read
                return (pool, written) if same and pool and pool["jump"] else None

            jump, jumped_at = wait_for(jumped, 60, 0.1, what="the jump flagged")
            before = [e for e in _intervals(cl, job_id) if _when(e) < jumped_at][-1]

            def shortened():
                after = [e for e in _intervals(cl, job_id) if _when(e) >= jumped_at]
                return after[0] if after and after[0]["seconds"] < before["seconds"] else None

            after = wait_for(shortened, 60, what="a shorter interval", log=log)
            saves_between = [s for s in _saves(cl, job_id) if jumped_at <= _when(s) < _when(after)]
    finally:
        cl.reset()  # the job cancelled, every node back
    print(
        f"rate {calm['per_node_hour']:.1f}/node-h (1 drain, {calm['window_seconds']:.0f} s) -> "
        f"{jump['per_node_hour']:.1f}/node-h (jump: {jump['preemptions']} in "
        f"{jump['window_seconds']:.0f} s); interval {before['seconds']} s -> {after['seconds']} s, "
        f"{len(saves_between)} save(s) after the jump was published, {_when(after) - jumped_at:.2f} s later"
    )
    assert jump["preemptions"] == 3 and after["basis"] == "live rate"
    assert len(saves_between) <= 1, saves_between  # taken again at the first save after the jump
    shown = subprocess.run(
        [SP, "history", job_id, "--json", "--no-sacct", "--state-dir", str(cl.spec.state_dir)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (attempt,) = json.loads(shown.stdout)["attempts"]
    assert before["seconds"] in attempt["checkpoint_intervals"]
    assert after["seconds"] in attempt["checkpoint_intervals"]
