"""Multi-rank agreement: real processes, each told of the preemption at a different step, all take the
final checkpoint at the same step boundary, and only rank 0 writes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_preempt.job.agreement import FileAgreement, SingleProcess
from slurm_preempt.job.checkpoint import CheckpointStore

WORKER = """
import dataclasses, json, os, signal, sys
from slurm_preempt import Run
from slurm_preempt.job import settings
from slurm_preempt.job.agreement import FileAgreement, TorchAgreement
from slurm_preempt.job.resume import Wiring

kind, folder = sys.argv[1], sys.argv[4]
rank, world, signal_step = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
agree_seconds = float(sys.argv[6])
env = {"RANK": str(rank), "WORLD_SIZE": str(world)}
if kind == "torch":
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{folder}/torch-store", rank=rank, world_size=world)
    agreement = TorchAgreement()
else:
    agreement = FileAgreement(f"{folder}/meet", rank, world)
paced = dataclasses.replace(settings.load(env), agree_seconds=agree_seconds)
run = Run(f"{folder}/ckpt", every=1000, settings=paced, _wiring=Wiring(environ=env, agreement=agreement))
state = run.restore() or {"step": 0, "total": 0}
for step in range(state["step"] + 1, 200):
    state = {"step": step, "total": state["total"] + step}
    if step == signal_step:
        os.kill(os.getpid(), signal.SIGUSR1)  # this rank alone is told
    if run.should_checkpoint(step):
        run.save(step, state)
    if run.preempted:
        print(json.dumps({"rank": rank, "step": step, "seen": run.notified}), flush=True)
        break
if kind == "torch":
    dist.destroy_process_group()
"""

# rank -> the step at which that rank alone receives SIGUSR1; rank 0 (the writer) hears nothing first
SIGNAL_STEPS = {0: 150, 1: 23, 2: 41, 3: 60}


def _run_ranks(tmp_path: Path, kind: str, agree_seconds: float = 0.0) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    world = len(SIGNAL_STEPS)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                kind,
                str(r),
                str(world),
                str(tmp_path),
                str(s),
                str(agree_seconds),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r, s in SIGNAL_STEPS.items()
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _check(tmp_path: Path, results: list[dict], paced: bool = False) -> None:
    first = min(SIGNAL_STEPS.values())
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    steps = {r["step"] for r in results}
    assert len(steps) == 1, results  # every rank at the same step boundary
    agreed = steps.pop()
    if paced:  # exchanges every K boundaries (K <= 100): the first exchange after the notice
        assert first <= agreed <= first + 100
    else:
        assert agreed == first
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.steps() == [agreed]  # written once, by rank 0, at the agreed step
    found, payload = store.restore()
    assert (found.step, payload) == (agreed, {"step": agreed, "total": agreed * (agreed + 1) // 2})


def test_ranks_agree_through_files(tmp_path):
    _check(tmp_path, _run_ranks(tmp_path, "file"))


def test_ranks_agree_through_torch_distributed(tmp_path):
    pytest.importorskip(
        "torch.distributed", reason="torch is not installed (pip install slurm-preempt[torch])"
    )
    _check(tmp_path, _run_ranks(tmp_path, "torch"))


def test_paced_exchanges_still_agree_on_one_step(tmp_path):
    # Steps of a few microseconds: the ranks exchange every K boundaries, K agreed among them.
    _check(tmp_path, _run_ranks(tmp_path, "file", agree_seconds=0.2), paced=True)


def test_single_process_agreement_is_the_identity():
    assert SingleProcess().agree([0, 1]) == [0, 1]


def test_file_agreement_takes_the_maximum_per_position(tmp_path):
    import threading

    world = 3
    answers = {}

    def rank(r):
        meet = FileAgreement(tmp_path, r, world)
        answers[r] = [meet.agree([r == 1, r]), meet.agree([0, 0]), meet.agree([0, r == 2])]

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a == [[1, 2], [0, 0], [0, 1]] for a in answers.values())


GROUP_WORKER = """
import sys
import torch.distributed as dist
from slurm_preempt.job.agreement import TorchAgreement

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/store", rank=0, world_size=1)
dist.get_backend = lambda group=None: "nccl"  # as under NCCL: the flags get a gloo group of their own
agreement = TorchAgreement()
assert agreement.agree([0, 1]) == [0, 1]
made = agreement.group
agreement.close()
agreement.close()  # twice is harmless
try:
    dist.get_process_group_ranks(made)
except KeyError:
    print("destroyed")
dist.destroy_process_group()  # the caller's own group is the caller's to destroy
"""


def test_the_gloo_group_made_for_the_flags_is_destroyed_on_close(tmp_path):
    pytest.importorskip("torch")
    done = subprocess.run(
        [sys.executable, "-c", GROUP_WORKER, str(tmp_path)], check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "destroyed\n", done.stdout + done.stderr
