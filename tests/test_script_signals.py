"""How a generated script passes a notice on, run outside Slurm with stand-ins for srun and the Slurm
commands: the command's own processes get the forward signal, srun never does (SIGTERM makes srun
kill its step at once), each numbered step is signalled through scancel, and after the command exits
the script waits for an srun it left behind before it requeues. The same on the real cluster, with
real srun and torchrun: tests/test_multinode_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurm_preempt.config import Config
from slurm_preempt.sbatch import render as gen

# The command: a program that starts an "srun" in its own process group, records the signals it gets,
# and exits 0 shortly after the first one (as a program that saves on SIGTERM would).
TARGET = r"""
import os, signal, subprocess, sys, time
work = sys.argv[1]
got = []
signal.signal(signal.SIGTERM, lambda n, f: got.append(signal.Signals(n).name))
subprocess.Popen([os.path.join(work, "bin", "srun")])
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


def _wait_for(path: Path, text: str = "", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{path} never held {text!r}"
        time.sleep(0.02)


def _script(tmp_path: Path, **options) -> Path:
    target = tmp_path / "target.py"
    target.write_text(TARGET)
    settings = {"checkpoint_dir": str(tmp_path / "ckpt"), "job_name": "sig", "grace": "30", **options}
    made = gen.generate(settings, [sys.executable, str(target), str(tmp_path)], Config())
    return gen.write_script(made.script, tmp_path / "job.sh")


def _start(tmp_path: Path, script: Path) -> subprocess.Popen:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text.format(work=tmp_path))
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_PREEMPT_STATE_DIR": str(tmp_path / "state"),
    }
    env.pop("SLURM_ARRAY_TASK_ID", None)
    log = open(tmp_path / "job.out", "w")  # noqa: SIM115 (closed by the caller)
    return subprocess.Popen(["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_notice_reaches_the_command_and_steps_never_srun(tmp_path):
    job = _start(tmp_path, _script(tmp_path))
    try:
        _wait_for(tmp_path / "ready")
        job.send_signal(signal.SIGUSR1)  # what the watcher's scancel --signal=USR1 --batch does
        _wait_for(tmp_path / "target.log")
        _wait_for(tmp_path / "scancel.args")
        _wait_for(tmp_path / "job.out", "waiting for its srun steps to end")
        assert job.poll() is None, _read(tmp_path / "job.out")  # srun still runs: no requeue yet
        (tmp_path / "release").touch()
        assert job.wait(20) == 0, _read(tmp_path / "job.out")
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
        job.wait(20)
    assert _read(tmp_path / "scancel.args") == "--signal=USR2 4242.0\n"
    assert "USR2" not in _read(tmp_path / "srun.log")
