"""Multi-node jobs on the real local cluster, preempted with the watcher running (gloo on CPU).

Each drill drains one of the job's nodes at T+0 and removes it at T+grace (its slurmd and processes
SIGKILLed, then DOWN). The job must be told on every rank, take one sharded final checkpoint at the
same step on all ranks, leave before the removal, run again on other nodes within seconds, redo no
step and end with exactly the result of an uninterrupted run, also after coming back on fewer nodes
(DCP reshards). Grace is compressed to seconds. The figures are printed (pytest -s), not asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterutil import running_watcher, submit_generated, wait_for
from slurm_preempt import ledger
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.rehearsal import drill

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch is not installed (pip install torch)"
    ),
]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_sharded.py"
STEPS, EVERY = 240, 20
LONG_STEPS = 1600  # 80 s of training at least: still running after a drill of SHRINK_GRACE
GRACE = 10.0
# A shrink must be done before the removal: the attempt's step ends (every agent and rank exits), then
# `resume shrink` asks Slurm, updates the job and checks it. That took 2.8 s on an idle machine and 5 s
# beside 4 busy loops, but 8-9 s in CI runs with four clusters side by side on 2 cores, and once more
# than 10 s (the removal came first and Slurm requeued the job). A site's drain-to-removal time is
# 5 minutes: these drills give the shrink 30 s, so CI's load cannot decide which path the job takes.
SHRINK_GRACE = 30.0
PRIME, SIZE = 1_000_003, 1200


def reference(steps: int = STEPS) -> int:
    """examples/train_sharded.py's result, computed here without torch (any world size gives it)."""
    weights = list(range(SIZE))
    for step in range(1, steps + 1):
        add = step + sum(weights) % PRIME
        weights = [(w * 31 + add) % PRIME for w in weights]
    return sum(w * (i + 1) % PRIME for i, w in enumerate(weights)) % PRIME


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train(result: Path, steps: int = STEPS) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--steps", str(steps), "--every", str(EVERY),
            "--step-seconds", "0.05", "--result", str(result)]  # fmt: skip


@pytest.fixture
def watcher(clean_cluster, tmp_path):
    with running_watcher(clean_cluster, tmp_path / "watch.log", GRACE) as proc:
        yield proc


@pytest.fixture
def shrink_watcher(clean_cluster, tmp_path):
    with running_watcher(clean_cluster, tmp_path / "watch.log", SHRINK_GRACE) as proc:
        yield proc


def _drill(cl, job_id: str, node: str, work: Path, grace: float = GRACE) -> drill.DrillEvent:
    wait_for(lambda: list((work / "ckpt").glob("step-*")), 180, what="a periodic checkpoint")
    runner = drill.Drill(cl.slurm, drill.node_ops(cl.slurm, allow_real=False), cl.spec.state_dir, tick=0.2)
    event = runner.start_event([node], grace=grace, pause=1, reason=drill.DEFAULT_REASON)
    runner.run_until_done(timeout=180)
    return event


def _moment(cl, job_id: str, kind: str, final: bool = False) -> float:
    """When the first ``kind`` event (a final one, for checkpoints) was written: ledger file names
    start with time_ns, finer than the events' own whole-second times."""
    for path in sorted(ledger.job_dir(cl.spec.state_dir, job_id).glob(f"*-{kind}.json")):
        if not final or json.loads(path.read_text()).get("final"):
            return int(path.name.split("-", 1)[0]) / 1e9
    raise AssertionError(f"no {kind} event for job {job_id}")


def _figures(cl, event: drill.DrillEvent, job_id: str) -> dict:
    watch = event.jobs[job_id]
    notified = _moment(cl, job_id, "notice_sent")
    saved = _moment(cl, job_id, "checkpoint_saved", final=True)
    figures = {
        "drain_to_notice": round(notified - event.drain_at, 2),
        "notice_to_final_checkpoint": round(saved - notified, 2),
        "drain_to_requeued": round(_moment(cl, job_id, "requeued") - event.drain_at, 2),
        "drain_to_running_again": round(watch.running_again_at - event.drain_at, 1),  # 0.2 s ticks
        "verdict": watch.verdict(event.removed_at),
    }
    print(f"\njob {job_id}: {json.dumps(figures)}")
    return figures


def _check_zero_steps_redone(cl, job_id: str) -> dict:
    events = ledger.events(cl.spec.state_dir, job_id)
    requeued = [e for e in events if e["kind"] == "requeued"]
    resumed = [e for e in events if e["kind"] == "resumed_from"]
    finals = [e for e in events if e["kind"] == "checkpoint_saved" and e.get("final")]
    assert len(requeued) == 1 and len(resumed) == 1 and len(finals) == 1, events
    # The final checkpoint holds the last step done, and the next attempt starts right after it.
    assert finals[0]["step"] == requeued[0]["step"] == resumed[0]["step"]
    return resumed[0]


def _job_log(work: Path, name: str, job_id: str) -> str:
    """The job's log, every attempt's in order: one file (``%x-%j.out``), or one per attempt
    (``%x-%j.%r.out``, the default from Slurm 25.11)."""
    one = work / f"{name}-{job_id}.out"
    if one.exists():
        return one.read_text()
    attempts = sorted(work.glob(f"{name}-{job_id}.*.out"), key=lambda p: int(p.name.split(".")[-2]))
    assert attempts, f"no log of job {job_id} in {work}"
    return "".join(path.read_text() for path in attempts)


def _check_every_rank_told(log: str, world: int) -> None:
    for rank in range(world):
        assert f"rank {rank}: preemption notice" in log, log
    # srun was never sent SIGTERM while the ranks saved. The requeue (made once the checkpoint is
    # committed) signals it: the lines of the library's "requeued" and srun's reply to Slurm's signal
    # come from different processes in any order, but slurmstepd logs the requeue before signalling.
    ends = [log.find(mark) for mark in ("requeued (attempt 1 ends)", "DUE TO JOB REQUEUE ***")]
    saving = log[: min((at for at in ends if at >= 0), default=len(log))]
    assert "srun: forcing job termination" not in saving, log


def test_torchrun_two_nodes_survive_a_drain_with_zero_steps_redone(clean_cluster, watcher, tmp_path):
    cl = clean_cluster
    work, result = tmp_path / "tr2", tmp_path / "tr2" / "result.json"
    options = ["--job-name", "tr2", "--template", "torchrun", "--nodes", "2", "--rdzv-port", str(free_port())]
    job_id = submit_generated(cl, work, options, _train(result))
    assert "--no-python" in (work / "job.sbatch").read_text()  # `python script.py` given to torchrun
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    assert len(first.nodes) == 2
    event = _drill(cl, job_id, first.nodes[0], work)  # the rendezvous node goes
    figures = _figures(cl, event, job_id)
    assert figures["verdict"].startswith("saved"), figures
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference() and got["world"] == 2 and got["attempt"] == 2
    _check_zero_steps_redone(cl, job_id)
    log = _job_log(work, "tr2", job_id)
    _check_every_rank_told(log, 2)
    _check_left_before_the_requeue(log)


def _check_left_before_the_requeue(log: str) -> None:
    """The ranks left the requeue to the batch script, which sent it once the step had ended by itself:
    Slurm never ended the step (srun's "Job step aborted: Waiting up to KillWait+2 seconds")."""
    left, requeued = log.find("the job script requeues the job"), log.find("requeued (attempt 1 ends)")
    assert 0 <= left < requeued, log
    assert "Job step aborted" not in log and "forcing job termination" not in log, log


def _has(cl, job_id: str, kind: str) -> bool:
    return any(e["kind"] == kind for e in ledger.events(cl.spec.state_dir, job_id))


def _check_shrunk_in_place(cl, job_id: str, event: drill.DrillEvent, left: str) -> dict:
    """The job went on without ``left`` in the same attempt: no requeue, no second prolog, one final
    checkpoint, and the command resumed at its step. Prints drain -> shrunk (Slurm) and -> training."""
    watch = event.jobs[job_id]
    assert watch.requeued_at is None and watch.verdict(event.removed_at).startswith("saved"), watch
    assert left not in watch.where and len(watch.where) == len(watch.nodes) - 1, watch
    wait_for(lambda: _has(cl, job_id, "resumed_from"), 120, what="the command running again")
    events = ledger.events(cl.spec.state_dir, job_id)
    kinds = [e["kind"] for e in events]
    assert "requeued" not in kinds, kinds  # and the result says attempt 1: SLURM_RESTART_COUNT unchanged
    (shrunk,) = [e for e in events if e["kind"] == "shrunk"]
    (final,) = [e for e in events if e["kind"] == "checkpoint_saved" and e.get("final")]
    (resumed,) = [e for e in events if e["kind"] == "resumed_from"]
    assert final["step"] == shrunk["step"] == resumed["step"] and resumed["attempt"] == 1
    assert shrunk["left"] == left and shrunk["nodes"] == len(watch.where)
    figures = {
        "drain_to_notice": round(_moment(cl, job_id, "notice_sent") - event.drain_at, 2),
        "drain_to_final_checkpoint": round(_moment(cl, job_id, "checkpoint_saved", True) - event.drain_at, 2),
        "drain_to_shrunk": round(_moment(cl, job_id, "shrunk") - event.drain_at, 2),
        "drain_to_training_again": round(_moment(cl, job_id, "resumed_from") - event.drain_at, 2),
    }
    print(f"\njob {job_id} shrank in place: {json.dumps(figures)}")
    return resumed


def test_three_nodes_shrink_in_place_to_two_and_reshard(clean_cluster, shrink_watcher, tmp_path):
    """--nodes=2-3 and a node that is not the batch host drained: the job gives that node back and goes on
    on the other two in the same attempt (before: a requeue), resharding its final checkpoint."""
    cl = clean_cluster
    work, result = tmp_path / "tr3", tmp_path / "tr3" / "result.json"
    options = ["--job-name", "tr3", "--template", "torchrun", "--nodes", "2-3",
               "--rdzv-port", str(free_port())]  # fmt: skip
    job_id = submit_generated(cl, work, options, _train(result))
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    assert len(first.nodes) == 3
    event = _drill(cl, job_id, first.nodes[1], work, SHRINK_GRACE)
    resumed = _check_shrunk_in_place(cl, job_id, event, first.nodes[1])
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference() and got["world"] == 2 and got["attempt"] == 1
    assert resumed["nodes"] == 2 and resumed["previous_nodes"] == 3
    newest = CheckpointStore(work / "ckpt").latest()
    assert newest.manifest["world"] == 2 and newest.manifest["format"] == "dcp"
    log = _job_log(work, "tr3", job_id)
    for rank in range(3):
        assert f"rank {rank}: preemption notice" in log, log
    assert "shrunk to 2 nodes" in log, log


def test_three_nodes_requeue_when_the_batch_host_leaves(clean_cluster, watcher, tmp_path):
    """The batch host cannot leave a job (Slurm keeps it): the requeue path, with one line saying why."""
    cl = clean_cluster
    work, result = tmp_path / "tr3b", tmp_path / "tr3b" / "result.json"
    options = ["--job-name", "tr3b", "--template", "torchrun", "--nodes", "2-3",
               "--rdzv-port", str(free_port())]  # fmt: skip
    job_id = submit_generated(cl, work, options, _train(result))
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    event = _drill(cl, job_id, first.nodes[0], work)
    _figures(cl, event, job_id)
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference() and got["attempt"] == 2
    _check_zero_steps_redone(cl, job_id)
    log = _job_log(work, "tr3b", job_id)
    assert f"requeue, not shrink: the batch host {first.nodes[0]} is leaving" in log, log


def test_srun_multitask_job_survives_a_drain_with_zero_steps_redone(clean_cluster, watcher, tmp_path):
    """The plain template with the user's own `srun python ...`: one task per node, no torchrun."""
    cl = clean_cluster
    work, result = tmp_path / "srun2", tmp_path / "srun2" / "result.json"
    options = ["--job-name", "srun2", "--nodes", "2", "--ntasks-per-node", "1",
               "--env", "MASTER_ADDR=127.0.0.1", "--env", f"MASTER_PORT={free_port()}"]  # fmt: skip
    job_id = submit_generated(cl, work, options, ["srun", *_train(result)])
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    event = _drill(cl, job_id, first.nodes[1], work)
    figures = _figures(cl, event, job_id)
    assert figures["verdict"].startswith("saved"), figures
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference() and got["world"] == 2
    _check_zero_steps_redone(cl, job_id)
    log = _job_log(work, "srun2", job_id)
    _check_every_rank_told(log, 2)
    _check_left_before_the_requeue(log)


def _srun_range_job(
    cl, tmp_path: Path, name: str, steps: int = STEPS, extra: Sequence[str] = ()
) -> tuple[str, Path, Path]:
    work, result = tmp_path / name, tmp_path / name / "result.json"
    # No --ntasks-per-node: with it sbatch asks for MIN tasks, and Slurm allocates only MIN nodes;
    # without it each srun runs one task per node of the allocation.
    options = ["--job-name", name, "--nodes", "2-3", *extra,
               "--env", "MASTER_ADDR=127.0.0.1", "--env", f"MASTER_PORT={free_port()}"]  # fmt: skip
    return submit_generated(cl, work, options, ["srun", *_train(result, steps)]), work, result


def test_srun_multitask_job_shrinks_in_place(clean_cluster, shrink_watcher, tmp_path):
    """`srun python ...` (one task per node) with --nodes=2-3: the second srun, run by the same batch
    script on the two nodes that stay, gets the shrunk job's environment (no stale SLURM_NTASKS)."""
    cl = clean_cluster
    job_id, work, result = _srun_range_job(cl, tmp_path, "srun3")
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    assert len(first.nodes) == 3
    event = _drill(cl, job_id, first.nodes[2], work, SHRINK_GRACE)
    _check_shrunk_in_place(cl, job_id, event, first.nodes[2])
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference() and got["world"] == 2 and got["attempt"] == 1


def test_a_shrunk_job_requeues_when_a_survivor_drains_below_min(clean_cluster, shrink_watcher, tmp_path):
    """3 -> 2 on a first drain; then one of the two drains: the watcher tells the job again (it no longer
    holds the first node), and with 1 node left, fewer than MIN, the job requeues from its checkpoint."""
    cl = clean_cluster
    # Long enough to be still running after the first drill, which lasts until that node's removal.
    job_id, work, result = _srun_range_job(cl, tmp_path, "twice", LONG_STEPS)
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    assert len(first.nodes) == 3
    event = _drill(cl, job_id, first.nodes[2], work, SHRINK_GRACE)
    _check_shrunk_in_place(cl, job_id, event, first.nodes[2])
    again = wait_for(lambda: _has(cl, job_id, "checkpoint_saved") and cl.slurm.job(job_id), 60, what="run")
    assert again.running, f"job {job_id} is {again.state} before the second drain: give it more steps"
    second = _drill(cl, job_id, first.nodes[1], work, SHRINK_GRACE)
    assert second.jobs[job_id].requeued_at is not None, second.jobs[job_id]
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["value"] == reference(LONG_STEPS) and got["attempt"] == 2
    kinds = [e["kind"] for e in ledger.events(cl.spec.state_dir, job_id)]
    assert kinds.count("shrunk") == 1 and kinds.count("requeued") == 1, kinds
    log = _job_log(work, "twice", job_id)
    assert "requeue, not shrink: 1 node(s) would stay, fewer than the job's minimum of 2" in log, log


LIGHTNING = Path(__file__).resolve().parents[1] / "examples" / "train_lightning.py"


def _lightning_reference(tmp_path: Path) -> dict:
    """The same training on two ranks, uninterrupted, here with torchrun (no Slurm)."""
    out = tmp_path / "reference.json"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", str(LIGHTNING), "--checkpoint-dir",
         str(tmp_path / "ref-ckpt"), "--step-seconds", "0", "--result", str(out)],
        check=False, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, f"reference run exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="pip install lightning")
def test_lightning_ddp_job_survives_a_drain_with_zero_steps_redone(clean_cluster, watcher, tmp_path):
    """`srun python train.py` with lightning.Trainer (DDP, two nodes) and PreemptionCallback: every rank
    hears the notice, one checkpoint mid-epoch, one requeue, and exactly the uninterrupted weights."""
    cl = clean_cluster
    expected = _lightning_reference(tmp_path)
    work, result = tmp_path / "lit", tmp_path / "lit" / "result.json"
    options = ["--job-name", "lit", "--nodes", "2", "--ntasks-per-node", "1", "--env", "OMP_NUM_THREADS=1",
               "--env", "MASTER_ADDR=127.0.0.1", "--env", f"MASTER_PORT={free_port()}"]  # fmt: skip
    command = ["srun", sys.executable, str(LIGHTNING), "--every", "10", "--step-seconds", "0.1",
               "--result", str(result)]  # fmt: skip
    job_id = submit_generated(cl, work, options, command)
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    event = _drill(cl, job_id, first.nodes[0], work)
    figures = _figures(cl, event, job_id)
    assert figures["verdict"].startswith("saved"), figures
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["steps"] == expected["steps"] and got["weights"] == expected["weights"]
    _check_zero_steps_redone(cl, job_id)  # mid-epoch or not, as the drill falls (tests/test_lightning.py)
    log = _job_log(work, "lit", job_id)
    _check_every_rank_told(log, 2)
    assert log.count("requeued (attempt 1 ends)") == 1  # requeued once, by the callback, not by Lightning
    assert "Handling auto-requeue signal" not in log


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="pip install lightning")
@pytest.mark.parametrize("leaving", [2, 0], ids=["shrinks", "batch-host-requeues"])
def test_lightning_ddp_range_job_shrinks_or_requeues(clean_cluster, shrink_watcher, tmp_path, leaving):
    """The callback path (PreemptionCallback) with --nodes=2-3: every rank saves Lightning's checkpoint at
    one batch; a node that is not the batch host leaves: the script gives it back and starts `srun
    python` again on the other two in the same attempt, Lightning resuming there (DDP: 3 ranks, then 2);
    the batch host leaves: the requeue path, from the same checkpoint. Lightning needs
    SLURM_NTASKS_PER_NODE for more than one task: `srun --ntasks-per-node` (sbatch's would get 2 nodes)."""
    cl = clean_cluster
    work, result = tmp_path / "lit3", tmp_path / "lit3" / "result.json"
    options = ["--job-name", "lit3", "--nodes", "2-3", "--env", "OMP_NUM_THREADS=1",
               "--env", "MASTER_ADDR=127.0.0.1", "--env", f"MASTER_PORT={free_port()}"]  # fmt: skip
    command = ["srun", "--ntasks-per-node", "1", sys.executable, str(LIGHTNING), "--epochs", "12", "--every",
               "10", "--step-seconds", "0.1", "--result", str(result)]  # fmt: skip
    job_id = submit_generated(cl, work, options, command)
    first = cl.wait_state(job_id, "RUNNING", timeout=60)
    assert len(first.nodes) == 3
    event = _drill(cl, job_id, first.nodes[leaving], work, SHRINK_GRACE)
    if leaving:
        resumed = _check_shrunk_in_place(cl, job_id, event, first.nodes[leaving])
        assert resumed["nodes"] == 2 and resumed["previous_nodes"] == 3
    else:
        assert _figures(cl, event, job_id)["verdict"].startswith("saved")
        resumed = _check_zero_steps_redone(cl, job_id)
    wait_for(result.exists, 300, interval=1, what="the job's result")
    cl.wait_state(job_id, "COMPLETED", timeout=120)
    got = json.loads(result.read_text())
    assert got["steps"] > resumed["step"] and got["world"] == resumed["nodes"]
    log = _job_log(work, "lit3", job_id)
    for rank in range(3):
        assert f"rank {rank}: preemption notice" in log, log
    assert "Handling auto-requeue signal" not in log, log
    if leaving:
        assert "shrunk to 2 nodes" in log, log
    else:
        assert f"requeue, not shrink: the batch host {first.nodes[0]} is leaving" in log, log
