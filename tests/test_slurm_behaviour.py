"""The Slurm behaviour slurm-preempt relies on, checked on the release this session runs (--slurm).

Each test states what README's table says for 22.05, 24.11, 25.11 and 26.05; CI runs them on all four.
Where releases differ, the test asks ``slurm/features.py`` which side of the boundary the running
release is on, so a boundary placed wrongly fails here. (Parsers and what the hooks see are checked on
captured output: test_parse, test_hooks.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterutil import SP, own_cluster, requeue_second_over, submit_generated, wait_for
from slurm_preempt import CheckpointStore
from slurm_preempt.errors import SlurmError
from slurm_preempt.slurm import features

pytestmark = pytest.mark.cluster


def _submit(cl, body: str, *args: str) -> str:
    script = cl.workdir / f"behaviour-{time.monotonic_ns()}.sh"
    script.write_text("#!/bin/bash\n" + body + "\n")
    return cl.slurm.submit(str(script), [f"--chdir={cl.workdir}", *args])


def _show(cl, job_id: str) -> dict[str, str]:
    text = cl.slurm.run(["scontrol", "show", "job", "-o", job_id])
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def test_requeue_hold_is_121_s_and_starttime_now_lifts_it(clean_cluster):
    """A removed node's --requeue job is requeued and held cred_expire + 1 s; the owner may lift it."""
    cl = clean_cluster
    job_id = _submit(cl, "sleep 300", "--requeue", "--constraint=preemptible", "--output=/dev/null")
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    cl.remove_node(node)
    held = wait_for(lambda: (j := cl.job(job_id)) and j.reason == "BeginTime" and j, 30, what="BeginTime")
    assert held.restart_count == 1
    # SubmitTime is reset to the requeue and EligibleTime set cred_expire + 1 = 121 s after it, on every
    # release; the two are whole seconds taken at two moments of the requeue (120 was seen once).
    assert 120 <= (held.eligible_time - held.submit_time).total_seconds() <= 122
    cl.slurm.update_job(job_id, starttime="now")
    again = cl.wait_state(job_id, "RUNNING", timeout=30)
    assert again.nodes[0] != node and again.restart_count == 1


def test_relaunch_on_the_node_just_left_is_killed_only_within_the_same_second(clean_cluster):
    """Slurm revokes a requeued job's credential on the node it left: a new launch there whose
    credential is not newer (same second) is killed at launch and ends FAILED, not requeued. 22.05
    schedules the released job at once (often that same second); 24.11 and 26.05 usually on their next
    pass (24.11's backfill once in the same second)."""
    cl = clean_cluster
    node = "pre3"
    job_id = _submit(cl, "sleep 300", "--requeue", f"--nodelist={node}", "--output=/dev/null")
    cl.wait_state(job_id, "RUNNING")
    cl.slurm.requeue(job_id)

    def launched_again():
        try:
            cl.slurm.update_job(job_id, starttime="now")
        except SlurmError:  # it launched already
            pass
        job = cl.job(job_id)
        return job if job and job.state in ("RUNNING", "FAILED") else None

    job = wait_for(launched_again, 30, interval=0.05, what="the job launched again")
    info = _show(cl, job_id)
    same_second = info["StartTime"] == info["SubmitTime"]  # SubmitTime: the requeue
    if job.state == "FAILED":
        assert same_second, info
    else:
        assert job.nodes == (node,)
    # 24.11 and 26.05 usually start it on their next pass, a later second; 24.11's backfill once started
    # a released job in the requeue's own second, and it was killed there the same way.


def test_one_array_task_runs_with_the_arrays_own_id(clean_cluster):
    """On every release the last task of an array carries the array's own job id."""
    cl = clean_cluster
    out = cl.workdir / "array-ids"
    out.mkdir()
    array_id = _submit(
        cl,
        f'echo "$SLURM_JOB_ID $SLURM_ARRAY_JOB_ID" > {out}/$SLURM_ARRAY_TASK_ID',
        "--array=0-2",
        "--output=/dev/null",
    )
    wait_for(lambda: len(list(out.iterdir())) == 3 and all(p.read_text() for p in out.iterdir()), 60)
    ids = {int(p.name): p.read_text().split() for p in out.iterdir()}
    assert [ids[t][1] for t in range(3)] == [array_id] * 3
    assert [ids[t][0] == array_id for t in range(3)] == [False, False, True]


def test_six_removals_never_reach_max_batch_requeue(clean_cluster):
    """A node set DOWN under a job does not count toward MaxBatchRequeue (5): preempted six times by
    removal, the job is never held for it and finishes."""
    cl = clean_cluster
    body = 'if [ "${SLURM_RESTART_COUNT:-0}" -ge 6 ]; then exit 0; fi; sleep 300'
    job_id = _submit(cl, body, "--requeue", "--constraint=preemptible", "--output=/dev/null")
    for removal in range(1, 7):
        node = cl.wait_state(job_id, "RUNNING", timeout=60).nodes[0]
        cl.remove_node(node)
        held = wait_for(lambda: (j := cl.job(job_id)) and j.reason == "BeginTime" and j, 30, what="requeued")
        assert held.restart_count == removal
        # Released while the node it left is still down, as a removed machine stays: it runs elsewhere.
        # Reviving the node first races Slurm: the node's return delivers the kill of the attempt that
        # failed there, and on 26.05 that kill also ended the new attempt launched there in the same
        # moment ("CANCELLED ... DUE TO NODE FAILURE", FAILED, not requeued; seen once).
        wait_for(lambda r=removal: _started_again(cl, job_id, r), 30, what="released")
        cl.revive_node(node)
    done = cl.wait_state(job_id, "COMPLETED", timeout=60)
    assert done.restart_count == 6


def _started_again(cl, job_id: str, restarts: int) -> bool:
    """Lift the requeue hold (each poll: an update while the job still completes does not take), once
    the second of the requeue is over: a launch on the node just left within it is killed (see
    test_relaunch_on_the_node_just_left_is_killed_only_within_the_same_second)."""
    job = cl.job(job_id)
    if job is not None and job.state == "PENDING" and not requeue_second_over(job):
        return False
    try:
        cl.slurm.update_job(job_id, starttime="now")
    except SlurmError:  # no longer pending: it started
        pass
    job = cl.job(job_id)
    return job is not None and job.restart_count == restarts and job.state in ("RUNNING", "COMPLETED")


def test_sinfo_version_needs_a_readable_slurm_conf(clean_cluster, tmp_path):
    """With SLURM_CONF naming a missing file, `sinfo --version` retries for a minute instead of answering
    (every release): slurm-preempt checks the file before it asks."""
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sinfo", "--version"], env=env, capture_output=True, timeout=4, check=False)
    assert clean_cluster.slurm.run(["sinfo", "--version"]).startswith("slurm")  # with the cluster's


def test_percent_r_in_output_names_from_25_11(clean_cluster):
    """`%r` in --output is the restart count from Slurm 25.11 (25.11, 26.05), a literal before."""
    cl = clean_cluster
    logs = cl.workdir / "percent-r"
    logs.mkdir()
    body = 'echo "attempt ${SLURM_RESTART_COUNT:-0}"; [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || sleep 300'
    job_id = _submit(cl, body, "--requeue", f"--output={logs}/log-%j-%r.out", "--open-mode=append")
    cl.wait_state(job_id, "RUNNING")
    wait_for(lambda: list(logs.iterdir()), 30, what="the first log")
    cl.slurm.requeue(job_id)
    wait_for(lambda: _started_again(cl, job_id, 1), 30, what="released")
    cl.wait_state(job_id, "COMPLETED", timeout=60)
    names = sorted(p.name for p in logs.iterdir())
    if features.has(cl.slurm.version(), features.RESTART_IN_FILE_NAMES):
        assert names == [f"log-{job_id}-0.out", f"log-{job_id}-1.out"]
    else:
        assert names == [f"log-{job_id}-%r.out"]


# ------------------------------------------------------------------- requeue_delay and expedited requeue
# A cluster of its own (clusterutil.OWN_CLUSTERS) with both settings on: every release must start with
# them (older ones ignore what they do not know), and each test asks features.py what the release does.
TUNED = ("SchedulerParameters=requeue_delay=5", "SlurmctldParameters=enable_expedited_requeue")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    with own_cluster(
        "tuned", tmp_path_factory.mktemp("tuned"), standard=1, preemptible=2, extra_conf=TUNED
    ) as handle:
        yield handle


def test_requeue_delay_sets_the_hold_from_25_11(tuned):
    """requeue_delay=5: a removed node's job is eligible 5 + 1 s after the requeue from 25.11; before,
    the setting is ignored and the hold stays cred_expire + 1 = 121 s."""
    cl = tuned
    job_id = _submit(cl, "sleep 300", "--requeue", "--constraint=preemptible", "--output=/dev/null")
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    cl.remove_node(node)
    held = wait_for(lambda: (j := cl.job(job_id)) and j.reason == "BeginTime" and j, 30, what="BeginTime")
    hold = (held.eligible_time - held.submit_time).total_seconds()
    print(f"Slurm {cl.slurm.version()}: requeue_delay=5 gives a hold of {hold:g} s")
    if features.has(cl.slurm.version(), features.REQUEUE_DELAY):
        assert 5 <= hold <= 7
    else:
        assert 120 <= hold <= 122
    cl.slurm.run(["scancel", job_id])
    cl.revive_node(node)


def test_expedited_requeue_from_25_11_restarts_on_other_nodes(tuned):
    """--requeue=expedite is refused before 25.11. From 25.11, with enable_expedited_requeue, a job whose
    node is removed goes EXPEDITING and runs again with no hold (no BeginTime), on a node it was not on:
    a node set DOWN does not hold it back."""
    cl = tuned
    args = ("--requeue=expedite", "--constraint=preemptible", "--output=/dev/null")
    if not features.has(cl.slurm.version(), features.EXPEDITED_REQUEUE):
        with pytest.raises(SlurmError):
            _submit(cl, "sleep 300", *args)
        return
    job_id = _submit(cl, "sleep 300", *args)
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    cl.remove_node(node)
    seen: set[str] = set()

    def running_again():
        job = cl.job(job_id)
        seen.add(f"{job.state}/{job.reason}" if job else "gone")
        return job if job and job.state == "RUNNING" and job.restart_count == 1 else None

    again = wait_for(running_again, 60, interval=0.1, what="the expedited job running again")
    print(f"Slurm {cl.slurm.version()}: expedited job went through {sorted(seen)}, now on {again.nodes}")
    assert again.nodes[0] != node and not any("BeginTime" in s for s in seen)
    cl.slurm.run(["scancel", job_id])
    cl.revive_node(node)


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_loop.py"


def _train(result: Path, step_seconds: float) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--steps", "400", "--every", "25", "--step-seconds",
            str(step_seconds), "--result", str(result)]  # fmt: skip


def test_a_generated_expedite_job_resumes_elsewhere_with_no_watcher(tuned, tmp_path):
    """`slurm-preempt sbatch --expedite` (25.11+): no watcher runs; the job's node is removed; Slurm
    starts it again at once on another node (no BeginTime hold) and it resumes from its checkpoint to
    the uninterrupted result. Before 25.11 the generator refuses the option in one line (exit 2)."""
    cl = tuned
    version = cl.slurm.version()
    release = ["--slurm-version", f"{version[0]}.{version[1]:02d}"]
    if not features.has(version, features.EXPEDITED_REQUEUE):
        refused = subprocess.run(
            [SP, "sbatch", "--expedite", *release, "--", "true"], check=False, capture_output=True
        )
        assert refused.returncode == 2 and refused.stderr.decode().count("\n") == 1, refused
        return
    reference = tmp_path / "reference.json"
    subprocess.run(
        _train(reference, 0) + ["--checkpoint-dir", str(tmp_path / "ref")], check=True, capture_output=True
    )
    work = tmp_path / "expedite"
    result = work / "result.json"
    job_id = submit_generated(
        cl, work, ["--job-name", "expedite", "--expedite", *release], _train(result, 0.05)
    )
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    wait_for(lambda: CheckpointStore(work / "ckpt").latest(), 60, what="a periodic checkpoint")
    cl.remove_node(node)
    seen: set[str] = set()

    def running_again():
        job = cl.job(job_id)
        seen.add(f"{job.state}/{job.reason}" if job else "gone")
        return job if job and job.state == "RUNNING" and job.restart_count >= 1 else None

    again = wait_for(running_again, 60, interval=0.1, what="the expedited job running again")
    wait_for(result.exists, 120, what="the job's result")
    print(f"Slurm {version}: generated expedite job went through {sorted(seen)}, then ran on {again.nodes}")
    assert again.nodes[0] != node and not any("BeginTime" in s for s in seen)
    assert json.loads(result.read_text())["value"] == json.loads(reference.read_text())["value"]
    log = "".join(out.read_text() for out in sorted(work.glob("*.out")))  # one per attempt from 25.11
    resumed = [int(step) for step in re.findall(r"resuming from step (\d+)", log)]
    assert resumed and resumed[0] > 0, log  # from its checkpoint, not from scratch
    cl.revive_node(node)
