"""torchrun's agent at a notice: one line and exit 0 where torchrun prints SignalException tracebacks
and exits 1. A real torchrun agent (torch CPU, one local worker, standalone rendezvous) gets SIGTERM,
as slurmstepd sends it to every process of the step, and its worker saves and exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = """
import os, signal, sys, time
work = sys.argv[1]
told = []
signal.signal(signal.SIGTERM, lambda n, f: told.append(n))
# Written whole under another name, then renamed: the test must never read a half-written pid.
with open(os.path.join(work, "worker.pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(work, "worker.pid.tmp"), os.path.join(work, "worker.pid"))
while not told:
    time.sleep(0.05)
time.sleep(0.3)  # the final checkpoint
print("worker: saved", flush=True)
"""


def _agent(tmp_path: Path, module: bool) -> subprocess.Popen:
    (tmp_path / "worker.py").write_text(WORKER)
    torchrun = (
        ["-m", "slurm_preempt.job.torchagent", "torchrun"] if module else ["-m", "torch.distributed.run"]
    )
    argv = [
        sys.executable,
        *torchrun,
        "--standalone",
        "--nproc-per-node=1",
        str(tmp_path / "worker.py"),
        str(tmp_path),
    ]
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60", "SLURMD_NODENAME": "pre9"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _notice(tmp_path: Path, agent: subprocess.Popen) -> tuple[int, str]:
    deadline = time.monotonic() + 120
    while not (tmp_path / "worker.pid").exists():
        assert agent.poll() is None and time.monotonic() < deadline, "the worker never started"
        time.sleep(0.05)
    os.kill(int((tmp_path / "worker.pid").read_text()), signal.SIGTERM)  # slurmstepd: every process
    agent.send_signal(signal.SIGTERM)
    out, _ = agent.communicate(timeout=120)
    return agent.returncode, out


def test_the_agent_says_one_line_and_exits_0_at_a_notice(tmp_path):
    pytest.importorskip("torch")
    rc, out = _notice(tmp_path, _agent(tmp_path, module=True))
    assert rc == 0, out
    assert "worker: saved" in out
    assert "slurm-preempt: torchrun agent on pre9: SIGTERM: its workers stopped; exiting 0" in out
    assert "Traceback" not in out and "SignalException" not in out and "death signal" not in out, out


def test_usr1_leaves_the_agent_alive(tmp_path):
    pytest.importorskip("torch")
    agent = _agent(tmp_path, module=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "worker.pid").exists():
            assert agent.poll() is None and time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        agent.send_signal(signal.SIGUSR1)
        time.sleep(0.5)  # USR1 is ignored: nothing to wait for but its absence of effect
        assert agent.poll() is None
    finally:
        rc, out = _notice(tmp_path, agent)
    assert rc == 0, out
