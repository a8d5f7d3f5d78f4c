"""A real job on the local cluster: drained, notified, final checkpoint, requeues itself, resumes on
another node at the same step, and ends with the result of an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from clusterutil import lift_requeue_hold, wait_for
from slurm_preempt import ledger
from slurm_preempt.notice import Notice, notice_path, utcnow, write_notice

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_loop.py"
STEPS = 200


def _job_script(workdir: Path) -> Path:
    script = workdir / "train.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"exec {sys.executable} {EXAMPLE} --checkpoint-dir {workdir / 'ckpt'} --steps {STEPS} "
        f"--every 10 --step-seconds 0.05 --result {workdir / 'result.json'}\n"
    )
    return script


def _uninterrupted(workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    result = workdir / "uninterrupted.json"
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--checkpoint-dir", str(workdir / "ckpt-plain"), "--steps", str(STEPS)]
        + ["--step-seconds", "0", "--result", str(result)],
        env=env,
        check=True,
    )
    return json.loads(result.read_text())


def _events(state_dir: Path, job_id: str, kind: str) -> list[dict]:
    return [e for e in ledger.events(state_dir, job_id) if e["kind"] == kind]


def _release(cluster, job_id: str) -> bool:
    """``scontrol update starttime=now`` works once the requeued job has left COMPLETING."""
    return lift_requeue_hold(cluster.slurm, job_id)


def test_drained_job_checkpoints_requeues_itself_and_resumes_at_the_same_step(clean_cluster):
    cluster = clean_cluster
    workdir = cluster.workdir / "resume-drill"
    workdir.mkdir()
    state_dir = Path(cluster.spec.state_dir)
    job_id = cluster.slurm.submit(
        str(_job_script(workdir)),
        ["--requeue", "--constraint=preemptible", "--open-mode=append", f"--output={workdir / 'job.log'}"],
    )
    first = cluster.wait_state(job_id, "RUNNING")
    node = first.nodes[0]
    wait_for(lambda: _events(state_dir, job_id, "checkpoint_saved"), 30, what="a periodic checkpoint")

    cluster.slurm.drain([node], "preempted by the test")
    notice = Notice.for_drain(job_id, node, "preempted by the test", "test", utcnow(), grace_seconds=30)
    write_notice(notice_path(state_dir, job_id), notice)
    cluster.slurm.signal(job_id, "USR1", batch_only=True)

    requeued = wait_for(lambda: _events(state_dir, job_id, "requeued"), 30, what="the job to requeue itself")
    wait_for(lambda: _release(cluster, job_id), 60, what="the requeued job to be pending")
    result_file = workdir / "result.json"
    wait_for(result_file.exists, 60, what="the resumed job to finish")

    result = json.loads(result_file.read_text())
    assert result["value"] == _uninterrupted(workdir)["value"]
    assert result["attempt"] == 2
    assert result["nodes"][0] == node and result["nodes"][1] != node  # resumed elsewhere (node drained)
    final = [e for e in _events(state_dir, job_id, "checkpoint_saved") if e["final"]]
    resumed = _events(state_dir, job_id, "resumed_from")
    assert len(final) == 1 and len(requeued) == 1  # our own requeue's SIGTERM started no second round
    assert resumed[0]["step"] == final[0]["step"] == requeued[0]["step"]
    assert resumed[0]["attempt"] == 2 and resumed[0]["previous_nodes"] == resumed[0]["nodes"] == 1
    assert requeued[0]["event_id"] == notice.event_id
    log = (workdir / "job.log").read_text()
    assert f"final checkpoint at step {final[0]['step']}" in log
    assert f"resuming from step {final[0]['step']} (attempt 2)" in log


SHELL_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "shell_job.sbatch"


def test_shell_job_example_survives_a_drain(clean_cluster):
    """examples/shell_job.sbatch (the bash example of docs/resume.md) on the real cluster."""
    cluster = clean_cluster
    workdir = cluster.workdir / "shell-drill"
    workdir.mkdir()
    state_dir = Path(cluster.spec.state_dir)
    steps = 150
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    job_id = cluster.slurm.submit(
        str(SHELL_EXAMPLE),
        [
            f"--chdir={workdir}",
            f"--output={workdir / 'job.log'}",
            f"--export=ALL,PATH={path},STEPS={steps},CKPT={workdir / 'ckpt'},RESULT={workdir / 'result.txt'}",
        ],
    )
    node = cluster.wait_state(job_id, "RUNNING").nodes[0]
    wait_for(lambda: _events(state_dir, job_id, "checkpoint_saved"), 30, what="a periodic checkpoint")

    cluster.slurm.drain([node], "preempted by the test")
    notice = Notice.for_drain(job_id, node, "preempted by the test", "test", utcnow(), grace_seconds=30)
    write_notice(notice_path(state_dir, job_id), notice)
    cluster.slurm.signal(job_id, "USR1", batch_only=True)

    requeued = wait_for(lambda: _events(state_dir, job_id, "requeued"), 30, what="the job to requeue itself")
    wait_for(lambda: _release(cluster, job_id), 60, what="the requeued job to be pending")
    result_file = workdir / "result.txt"
    wait_for(result_file.exists, 60, what="the resumed job to finish")

    assert int(result_file.read_text()) == steps * (steps + 1) // 2
    final = [e for e in _events(state_dir, job_id, "checkpoint_saved") if e["final"]]
    assert len(final) == 1 and len(requeued) == 1
    assert final[0]["step"] == requeued[0]["step"]
    assert requeued[0]["event_id"] == notice.event_id
    log = (workdir / "job.log").read_text()
    assert f"notice: final checkpoint at step {final[0]['step']}" in log
    assert f"attempt 2: resuming at step {final[0]['step']}" in log


ARRAY_SCRIPT = """#!/bin/bash
attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))
if [ "$SLURM_ARRAY_TASK_ID" = 1 ] && [ "$attempt" = 1 ]; then
    echo "$SLURMD_NODENAME" > left-node.txt
    slurm-preempt resume requeue && exit 0
fi
echo "$attempt" > "task-$SLURM_ARRAY_TASK_ID.txt"
"""


def test_array_task_requeues_only_itself(clean_cluster):
    """Task 1 of 0-1 starts last and runs as the array's own id (22.05): a bare `scontrol requeue <id>`
    there would requeue task 0 as well."""
    cluster = clean_cluster
    workdir = cluster.workdir / "array"
    workdir.mkdir()
    script = workdir / "array.sbatch"
    script.write_text(ARRAY_SCRIPT)
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    array_id = cluster.slurm.submit(
        str(script),
        ["--array=0-1", "--requeue", f"--chdir={workdir}", "--output=/dev/null", f"--export=ALL,PATH={path}"],
    )

    def task_one_requeued():
        tasks = [j for j in cluster.slurm.jobs() if j.array_job_id == array_id and j.array_task_id == "1"]
        return tasks[0] if tasks and tasks[0].pending and tasks[0].restart_count == 1 else None

    task = wait_for(task_one_requeued, 30, what="array task 1 to requeue itself")
    # Released at once onto the node it just left, Slurm would kill it at launch ("Job credential
    # revoked"): in a real preemption that node is drained, so drain it here too.
    left = (workdir / "left-node.txt").read_text().strip()
    cluster.slurm.drain([left], "preempted")
    # `scontrol update jobid=<that id>` would touch the whole array too: name the task.
    wait_for(lambda: _release(cluster, f"{array_id}_1"), 30, what="task 1 to be released")
    wait_for((workdir / "task-1.txt").exists, 30, what="task 1 to run again")
    cluster.slurm.resume([left])
    assert (workdir / "task-0.txt").read_text().strip() == "1"  # the other task ran once, untouched
    assert (workdir / "task-1.txt").read_text().strip() == "2"
    assert _events(Path(cluster.spec.state_dir), task.job_id, "requeued")


def test_run_inside_a_script_from_slurm_preempt_sbatch(clean_cluster):
    """The generated batch shell gets USR1 and forwards SIGTERM; Run takes it as the notice, saves,
    requeues itself; the shell sees the requeue and leaves it alone; the next attempt resumes."""
    cluster = clean_cluster
    workdir = cluster.workdir / "sbatch-drill"
    workdir.mkdir()
    state_dir = Path(cluster.spec.state_dir)
    command = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--every", "10", "--step-seconds", "0.05"]
    script = subprocess.run(
        [
            str(Path(sys.executable).parent / "slurm-preempt"),
            "sbatch",
            "--chdir",
            str(workdir),
            "--no-sidecar",
        ]
        + ["--output", str(workdir / "job.log"), "--checkpoint-dir", str(workdir / "ckpt"), "--"]
        + [*command, "--result", str(workdir / "result.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (workdir / "job.sh").write_text(script)
    job_id = cluster.slurm.submit(str(workdir / "job.sh"))
    node = cluster.wait_state(job_id, "RUNNING").nodes[0]
    wait_for(lambda: _events(state_dir, job_id, "checkpoint_saved"), 30, what="a periodic checkpoint")

    cluster.slurm.drain([node], "preempted by the test")
    notice = Notice.for_drain(job_id, node, "preempted by the test", "test", utcnow(), grace_seconds=30)
    write_notice(notice_path(state_dir, job_id), notice)
    cluster.slurm.signal(job_id, "USR1", batch_only=True)

    requeued = wait_for(lambda: _events(state_dir, job_id, "requeued"), 30, what="the job to requeue itself")
    wait_for(lambda: _release(cluster, job_id), 60, what="the requeued job to be pending")
    wait_for((workdir / "result.json").exists, 60, what="the resumed job to finish")

    result = json.loads((workdir / "result.json").read_text())
    assert result["value"] == _uninterrupted(workdir)["value"] and result["attempt"] == 2
    assert len(requeued) == 1 and requeued[0]["event_id"] == notice.event_id
    resumed = _events(state_dir, job_id, "resumed_from")
    assert resumed[0]["step"] == requeued[0]["step"]


FINISHES_THEN_HEARS = """import pathlib, sys, time
import slurm_preempt
work = pathlib.Path(sys.argv[1])
run = slurm_preempt.Run(every=5)
for step in range(run.step + 1, 11):
    if run.should_checkpoint(step):
        run.save(step, {"step": step})
(work / "last-step-done").touch()
while not run.notified:  # the notice lands after the last step, before the program exits
    time.sleep(0.05)
run.close()
(work / "completions").open("a").write("done\\n")
"""


def test_a_notice_after_the_last_step_does_not_run_the_finished_job_again(clean_cluster):
    """The batch shell requeues a command that exits after a notice, unless the command says its work
    was done (Run.close() creates SLURM_PREEMPT_DONE_FILE): the job completes once, not twice."""
    cluster = clean_cluster
    workdir = cluster.workdir / "late-notice"
    workdir.mkdir()
    program = workdir / "finish.py"
    program.write_text(FINISHES_THEN_HEARS)
    script = subprocess.run(
        [str(Path(sys.executable).parent / "slurm-preempt"), "sbatch", "--chdir", str(workdir),
         "--no-sidecar", "--output", str(workdir / "job.log"), "--checkpoint-dir", str(workdir / "ckpt"),
         "--", sys.executable, str(program), str(workdir)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (workdir / "job.sh").write_text(script)
    job_id = cluster.slurm.submit(str(workdir / "job.sh"))
    wait_for((workdir / "last-step-done").exists, 60, what="the program's last step")
    cluster.slurm.signal(job_id, "USR1", batch_only=True)

    def ended():
        job = cluster.job(job_id)
        return job if job is not None and job.state not in ("RUNNING", "PENDING", "COMPLETING") else None

    job = wait_for(ended, 60, what="the job to end")
    assert job.state == "COMPLETED" and job.restart_count == 0
    assert (workdir / "completions").read_text() == "done\n"
    assert "finished its work before the notice reached it" in (workdir / "job.log").read_text()
    assert not _events(Path(cluster.spec.state_dir), job_id, "requeued")
