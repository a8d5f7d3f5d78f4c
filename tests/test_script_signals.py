"""How a generated script passes a notice on, run outside Slurm with stand-ins for srun and the Slurm
commands: the command's own processes get the forward signal, srun never does (SIGTERM makes srun
kill its step at once), each numbered step is signalled through scancel, and after the command exits
the script waits for an srun it left behind before it requeues. The same on the real cluster, with
real srun and torchrun: tests/test_multinode_cluster.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterutil import HUNG_AFTER
from slurm_preempt import ledger
from slurm_preempt.config import Config
from slurm_preempt.sbatch import render as gen

# The command: a program that starts an "srun" in its own process group, records the signals it gets,
# and exits 0 shortly after the first one (as a program that saves on SIGTERM would).
TARGET = r"""
import os, signal, subprocess, sys, time
work, loader = sys.argv[1], sys.argv[2:]
got = []
signal.signal(signal.SIGTERM, lambda n, f: got.append(signal.Signals(n).name))
subprocess.Popen([*loader, os.path.join(work, "bin", "srun")])
open(os.path.join(work, "ready"), "w").close()
while not got:
    time.sleep(0.02)
time.sleep(0.3)
with open(os.path.join(work, "target.log"), "w") as out:
    out.write(" ".join(got))
"""

# Stand-ins: srun (its process name is "srun") records any signal and runs until released; squeue
# lists a numbered step beside the batch and extern steps; scancel and scontrol record their argv.
FAKES = {
    "srun": """#!/bin/bash
for sig in TERM INT HUP USR1 USR2; do trap "echo $sig >> '{work}/srun.log'" $sig; done
while [ ! -e '{work}/release' ]; do sleep 0.05; done
echo released >> '{work}/srun.log'
""",
    "squeue": """#!/bin/bash
echo "$*" >> '{work}/squeue.args'
printf '%s\\n' "$SLURM_JOB_ID.0" "$SLURM_JOB_ID.batch" "$SLURM_JOB_ID.extern"
""",
    "scancel": """#!/bin/bash
echo "$*" >> '{work}/scancel.args'
""",
    "scontrol": """#!/bin/bash
echo "$*" >> '{work}/scontrol.args'
""",
}


def _wait_for(path: Path, text: str = "", timeout: float = HUNG_AFTER) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{path} never held {text!r}"
        time.sleep(0.02)


def _script(tmp_path: Path, loader: list[str] = (), **options) -> Path:
    target = tmp_path / "target.py"
    target.write_text(TARGET)
    settings = {"checkpoint_dir": str(tmp_path / "ckpt"), "job_name": "sig", "grace": "30", **options}
    made = gen.generate(settings, [sys.executable, str(target), str(tmp_path), *loader], Config())
    return gen.write_script(made.script, tmp_path / "job.sh")


def _start(tmp_path: Path, script: Path, fakes: dict[str, str] = FAKES, **environ: str) -> subprocess.Popen:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in fakes.items():
        (bin_dir / name).write_text(text.format(work=tmp_path))
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_PREEMPT_STATE_DIR": str(tmp_path / "state"),
        **environ,
    }
    env.pop("SLURM_ARRAY_TASK_ID", None)
    log = open(tmp_path / "job.out", "w")  # noqa: SIM115 (closed by the caller)
    return subprocess.Popen(["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# The dynamic loader, run as a program: how the local cluster runs another Slurm release's commands
# (rehearsal/slurmroot.py: ROOT/lib64/ld-linux-x86-64.so.2 --inhibit-cache --library-path ... --argv0
# srun ROOT/usr/bin/srun ...). Its process name is the loader's, srun only one word of its argv.
LOADERS = sorted(Path("/").glob("lib*/ld-linux*.so.*"))


def _loader(tmp_path: Path, how: str) -> list[str]:
    """The words before the fake srun: none, or the loader with a root's options running an ELF
    named srun (bash, which then runs the fake srun script given after these words)."""
    if how == "direct":
        return []
    if not LOADERS:
        pytest.skip("no dynamic loader at /lib*/ld-linux*.so.*")
    elf = tmp_path / "root" / "usr" / "bin" / "srun"
    elf.parent.mkdir(parents=True)
    elf.symlink_to(os.path.realpath(shutil.which("bash")))
    root_libs = str(tmp_path / "root" / "lib")
    return [str(LOADERS[0]), "--inhibit-cache", "--library-path", root_libs, "--argv0", "srun", str(elf)]


@pytest.mark.parametrize("how", ["direct", "through a loader"])
def test_notice_reaches_the_command_and_steps_never_srun(tmp_path, how):
    job = _start(tmp_path, _script(tmp_path, _loader(tmp_path, how)))
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)  # what the watcher's scancel --signal=USR1 --batch does
        _wait_for(tmp_path / "target.log")
        _wait_for(tmp_path / "scancel.args")
        _wait_for(tmp_path / "job.out", "waiting for its srun steps to end")
        assert job.poll() is None, _read(tmp_path / "job.out")  # srun still runs: no requeue yet
        (tmp_path / "release").touch()
        assert job.wait(HUNG_AFTER) == 0, _read(tmp_path / "job.out")
    finally:
        (tmp_path / "release").touch()
        job.kill()
    assert _read(tmp_path / "target.log") == "SIGTERM"
    assert _read(tmp_path / "srun.log") == "released\n"  # srun itself was never signalled
    # Numbered steps only, never the batch shell itself (nor the extern step), named by the job.
    assert _read(tmp_path / "squeue.args").split() == ["-h", "-s", "-j", "4242", "-o", "%i"]
    assert _read(tmp_path / "scancel.args") == "--signal=TERM 4242.0\n"
    assert _read(tmp_path / "scontrol.args") == "requeue 4242\n"
    assert "requeueing job 4242" in _read(tmp_path / "job.out")


def test_the_forward_signal_is_the_one_passed_to_steps(tmp_path):
    job = _start(tmp_path, _script(tmp_path, forward_signal="USR2"))
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)
        _wait_for(tmp_path / "scancel.args")
    finally:
        (tmp_path / "release").touch()
        job.kill()
        job.wait(HUNG_AFTER)
    assert _read(tmp_path / "scancel.args") == "--signal=USR2 4242.0\n"
    assert "USR2" not in _read(tmp_path / "srun.log")


# ------------------------------------------------------------------ sp_is_srun: argv is data


def _is_srun(tmp_path: Path, argv: list[str]) -> bool:
    """Run ``argv`` and ask the generated script's own sp_is_srun about that process."""
    script = _script(tmp_path).read_text()
    start = script.index("sp_is_srun() {")
    function = script[start : script.index("\n}\n", start) + 3]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_exec(proc.pid, argv[0])
        comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        check = f'{function}\nsp_is_srun "$1" "$2"'
        answer = subprocess.run(["bash", "-c", check, "check", str(proc.pid), comm], check=False)
        assert proc.poll() is None, f"{argv} ended before it was asked about"
        return answer.returncode == 0
    finally:
        proc.kill()
        proc.wait()


def _wait_for_exec(pid: int, program: str, timeout: float = HUNG_AFTER) -> None:
    """Popen may return before the child has exec'd (its name and argv are still Python's)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] != os.fsencode(program):
        assert time.monotonic() < deadline, f"{program} never started"
        time.sleep(0.01)


def _elf(tmp_path: Path, name: str) -> str:
    """An executable called ``name`` that the loader can run: bash under that name."""
    path = tmp_path / "elf" / name
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.symlink_to(os.path.realpath(shutil.which("bash")))
    return str(path)


SLEEP = ["-c", "sleep 30; :"]  # bash stays the process (a lone command would be exec'd)
TRICKY = ["srun", "/usr/bin/srun", "--argv0", "--library-path", "--", "-", "ld.so", "x\nsrun", " srun"]


@pytest.mark.skipif(not LOADERS, reason="no dynamic loader at /lib*/ld-linux*.so.*")
def test_srun_through_a_loader_is_known_by_its_program(tmp_path):
    loader = str(LOADERS[0])
    assert _is_srun(tmp_path, [loader, _elf(tmp_path, "srun"), *SLEEP])
    root = ["--inhibit-cache", "--library-path", "/r/lib", "--argv0", "srun"]
    assert _is_srun(tmp_path, [loader, *root, _elf(tmp_path, "srun"), *SLEEP, *TRICKY])
    # The options' values and the program's arguments are never the program.
    assert not _is_srun(tmp_path, [loader, "--argv0", "srun", _elf(tmp_path, "python"), *SLEEP])
    assert not _is_srun(tmp_path, [loader, "--library-path", "/srun", _elf(tmp_path, "python"), *SLEEP])
    assert not _is_srun(tmp_path, [loader, _elf(tmp_path, "python"), *SLEEP, *TRICKY])
    # A program whose own name is srun but that is no loader is known by that name only.
    assert not _is_srun(tmp_path, [_elf(tmp_path, "python"), *SLEEP, "srun"])


@pytest.mark.skipif(not LOADERS, reason="no dynamic loader at /lib*/ld-linux*.so.*")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    args=st.lists(
        st.sampled_from(TRICKY)
        | st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"])),
        max_size=5,
    )
)
def test_no_argument_makes_a_loaded_program_srun(tmp_path, args):
    loader = str(LOADERS[0])
    assert not _is_srun(tmp_path, [loader, _elf(tmp_path, "python"), *SLEEP, *args])
    assert _is_srun(tmp_path, [loader, _elf(tmp_path, "srun"), *SLEEP, *args])


def _start_with_notice(tmp_path: Path, notice_restart: int | None, restart_count: str, **options):
    """The script as attempt ``restart_count`` of job 4242, its notice file naming attempt
    ``notice_restart`` (None: no restart count in it, as an older watcher writes)."""
    notices = tmp_path / "state" / "notices"
    notices.mkdir(parents=True)
    notice = {"job_id": "4242", "node": "pre1", "deadline": "2026-12-01T06:05:00Z"}
    if notice_restart is not None:
        notice["restart_count"] = notice_restart
    (notices / "4242.json").write_text(json.dumps(notice))
    os.environ["SLURM_RESTART_COUNT"] = restart_count
    try:
        return _start(tmp_path, _script(tmp_path, **options))
    finally:
        del os.environ["SLURM_RESTART_COUNT"]


def test_a_retried_signal_of_an_earlier_attempt_is_not_a_notice(tmp_path):
    """scancel retries a USR1 Slurm refused during a transition 5 s later, by job id: after the job
    requeued itself, the retry reaches the next attempt, whose notice file still names the earlier
    one. The shell ignores it (seen in tests/test_e2e.py: a second, needless requeue)."""
    job = _start_with_notice(tmp_path, notice_restart=0, restart_count="1")
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)
        _wait_for(tmp_path / "job.out", "without a notice for this attempt")
        assert not (tmp_path / "target.log").exists()  # the command was not told
        job.send_signal(signal.SIGTERM)  # end the test: Slurm's own SIGTERM is always passed on
        (tmp_path / "release").touch()
        job.wait(HUNG_AFTER)
    finally:
        (tmp_path / "release").touch()
        job.kill()
    assert not (tmp_path / "scontrol.args").exists()  # never requeued


@pytest.mark.parametrize(
    ("notice_restart", "options"), [(1, {}), (None, {}), (0, {"timelimit_notice": "60"})]
)
def test_a_notice_for_this_attempt_or_of_unknown_attempt_acts(tmp_path, notice_restart, options):
    """The same signal acts when the notice names this attempt, names none (an older watcher), or
    may be Slurm's time-limit warning (--timelimit-notice sends the same signal, with no notice)."""
    job = _start_with_notice(tmp_path, notice_restart=notice_restart, restart_count="1", **options)
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)
        _wait_for(tmp_path / "target.log")
        (tmp_path / "release").touch()
        assert job.wait(HUNG_AFTER) == 0, _read(tmp_path / "job.out")
    finally:
        (tmp_path / "release").touch()
        job.kill()
    assert _read(tmp_path / "scontrol.args") == "requeue 4242\n"


def test_a_notice_after_the_command_finished_its_work_is_not_passed_on(tmp_path):
    """Run.close() marks the work done and puts the signal handlers back: a SIGTERM then would kill
    the command during its last lines, and the job would be requeued and end twice (seen in
    tests/test_e2e.py's sweep on 24.11: a task's completion written twice)."""
    ending = f'touch "$SLURM_PREEMPT_DONE_FILE" {tmp_path}/ready; sleep 1; echo finished > {tmp_path}/ended'
    settings = {"checkpoint_dir": str(tmp_path / "ckpt"), "job_name": "sig", "grace": "30"}
    made = gen.generate(settings, ["bash", "-c", ending], Config())
    job = _start(tmp_path, gen.write_script(made.script, tmp_path / "job.sh"))
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)
        assert job.wait(HUNG_AFTER) == 0, _read(tmp_path / "job.out")
    finally:
        job.kill()
    assert "has finished its work: not passed on" in _read(tmp_path / "job.out")
    assert _read(tmp_path / "ended") == "finished\n"  # its last lines ran
    assert not (tmp_path / "scontrol.args").exists()  # never requeued


# The command's rank, after its final checkpoint on more than one node (job/requeue.py's leave): it
# leaves the requeue to the script in the file the script names, and exits.
LEAVES = (
    'echo "${SLURM_PREEMPT_SCRIPT_REQUEUES:-none}" > WORK/named; '
    '[ -z "$SLURM_PREEMPT_SCRIPT_REQUEUES" ] || touch "$SLURM_PREEMPT_SCRIPT_REQUEUES"'
)
# Slurm answers a requeue with SIGTERM to every process of the batch step: the requeuing one too.
SIGTERM_ON_REQUEUE = {**FAKES, "scontrol": FAKES["scontrol"] + "kill -TERM $PPID\nsleep 0.5\n"}


@pytest.mark.parametrize("nodes", ["2", "1"])
def test_on_several_nodes_the_script_requeues_once_the_command_has_left(tmp_path, nodes):
    """The script names a file for the command on more than one node; a command that made it (no signal
    reached the script: the rank read the notice file) is requeued by the script once it has exited,
    through `resume requeue`, which records it although Slurm's SIGTERM comes during it. On one node the
    command requeues itself: the script names no file and requeues nothing."""
    settings = {"checkpoint_dir": str(tmp_path / "ckpt"), "job_name": "sig", "grace": "30", "nodes": "1-2"}
    made = gen.generate(settings, ["bash", "-c", LEAVES.replace("WORK", str(tmp_path))], Config())
    script = gen.write_script(made.script, tmp_path / "job.sh")
    job = _start(tmp_path, script, SIGTERM_ON_REQUEUE, SLURM_JOB_NUM_NODES=nodes)
    try:
        assert job.wait(HUNG_AFTER) == 0, _read(tmp_path / "job.out")
    finally:
        job.kill()
    named = _read(tmp_path / "named").strip()
    requeued = [e for e in ledger.events(tmp_path / "state", "4242") if e["kind"] == "requeued"]
    if nodes == "1":
        assert named == "none" and not (tmp_path / "scontrol.args").exists() and not requeued
        return
    assert named == str(tmp_path / "ckpt" / ".requeue-4242-1") and not Path(named).exists()
    assert _read(tmp_path / "scontrol.args") == "requeue 4242\n"
    assert len(requeued) == 1, _read(tmp_path / "job.out")
    assert "job 4242 requeued (attempt 1 ends)" in _read(tmp_path / "job.out")


# The command on several nodes: its rank saves at the forward signal and makes the file the script named
# (the final checkpoint is durable), while its srun stays (torchrun's agents in their exit barrier).
SAVES_AND_STAYS = 'trap \'touch "$SLURM_PREEMPT_SCRIPT_REQUEUES" ALSO\' TERM; "$0" & wait $!; wait $!'
# Slurm ends a step that scancel --signal=KILL reaches: the stand-in srun is released.
KILL_ENDS_THE_STEP = {
    **SIGTERM_ON_REQUEUE,
    "scancel": FAKES["scancel"] + "[ \"$1\" != --signal=KILL ] || touch '{work}/release'\n",
    "srun": FAKES["srun"].replace("\n", "\ntouch '{work}/ready'\n", 1),
}


@pytest.mark.parametrize("srun_ends", ["by itself", "never"])
def test_once_the_final_checkpoint_is_durable_a_step_that_stays_is_ended(tmp_path, srun_ends):
    """On several nodes, after a notice: once the command's final checkpoint is durable (the file is
    made), srun gets STEP_END_WAIT s to end by itself; a step still there then is ended through Slurm
    (SIGKILL), and the job requeued before the node's removal, not held by the step until it."""
    also = f"'{tmp_path}/release'" if srun_ends == "by itself" else ""
    command = ["bash", "-c", SAVES_AND_STAYS.replace("ALSO", also), str(tmp_path / "bin" / "srun")]
    settings = {"checkpoint_dir": str(tmp_path / "ckpt"), "job_name": "sig", "grace": "30", "nodes": "2"}
    made = gen.generate(settings, command, Config())
    job = _start(tmp_path, gen.write_script(made.script, tmp_path / "job.sh"), KILL_ENDS_THE_STEP,
                 SLURM_JOB_NUM_NODES="2")  # fmt: skip
    try:
        _wait_for(tmp_path / "ready")  # its srun runs, the command's trap set before
        job.send_signal(signal.SIGUSR1)
        assert job.wait(HUNG_AFTER) == 0, _read(tmp_path / "job.out")
    finally:
        (tmp_path / "release").touch()
        job.kill()
    out = _read(tmp_path / "job.out")
    sent = _read(tmp_path / "scancel.args").splitlines()
    assert sent[0] == "--signal=TERM 4242.0", sent  # the notice, passed on to the step
    if srun_ends == "never":
        assert sent[1:] == ["--signal=KILL 4242.0"], sent
        assert "srun has not ended 5 s later: ending its steps" in out, out
    else:
        assert sent[1:] == [] and "ending its steps" not in out, out
    assert _read(tmp_path / "scontrol.args") == "requeue 4242\n"
    assert "job 4242 requeued (attempt 1 ends)" in out, out


# ------------------------------------------------------------------ the notice's cost follows the job

NO_STEPS = r"""
import os, signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda n, f: got.append(signal.Signals(n).name))
open(os.path.join(sys.argv[1], "ready"), "w").close()
while not got:
    time.sleep(0.02)
with open(os.path.join(sys.argv[1], "target.log"), "w") as out:
    out.write(" ".join(got))
"""


def test_a_command_without_steps_costs_slurmctld_no_round_trip(tmp_path):
    target = tmp_path / "nosteps.py"
    target.write_text(NO_STEPS)
    settings = {"checkpoint_dir": str(tmp_path / "ckpt"), "job_name": "sig", "grace": "30"}
    made = gen.generate(settings, [sys.executable, str(target), str(tmp_path)], Config())
    job = _start(tmp_path, gen.write_script(made.script, tmp_path / "job.sh"))
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)
        _wait_for(tmp_path / "target.log")
        assert job.wait(20) == 0, _read(tmp_path / "job.out")
    finally:
        job.kill()
    assert _read(tmp_path / "target.log") == "SIGTERM"
    assert not (tmp_path / "squeue.args").exists() and not (tmp_path / "scancel.args").exists()
    assert _read(tmp_path / "scontrol.args") == "requeue 4242\n"


def _functions(script: str, *names: str) -> str:
    parts = []
    for name in names:
        start = script.index(f"{name}() {{")
        parts.append(script[start : script.index("\n}\n", start) + 3])
    return "".join(parts)


def test_the_handler_reads_the_jobs_own_processes_not_the_nodes(tmp_path):
    """Outside a Slurm cgroup, the processes looked at are this shell's tree: its command, the
    command's children, nothing else of the node (this test's own process is not among them)."""
    functions = _functions(_script(tmp_path).read_text(), "sp_job_pids", "sp_tree", "sp_group")
    functions = "sp_seen=\n" + functions
    check = functions + (
        "set -m; bash -c 'sleep 30 & sleep 30 & wait' & sp_child=$!; set +m\n"
        "while [ $(wc -w < /proc/$sp_child/task/$sp_child/children) -lt 2 ]; do sleep 0.02; done\n"
        'sp_job_pids; echo "tree: ${sp_pids[*]}"; echo "child: $sp_child"\n'
        'sp_group; printf "%s\\n" "${sp_members[@]}"\n'
        "kill -- -$sp_child\n"
    )
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    out = subprocess.run(
        ["bash", "-c", check], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    lines = out.stdout.splitlines()
    tree = lines[0].split()[1:]
    child = lines[1].split()[1]
    group = [line.split() for line in lines[2:]]
    assert str(os.getpid()) not in tree and len(tree) == 4, tree  # this shell and the group of three
    assert [pid for pid, _comm in group][0] == child
    assert sorted(comm for _pid, comm in group) == ["bash", "sleep", "sleep"]
