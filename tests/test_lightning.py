"""The Lightning callback without Slurm: two DDP ranks (torchrun, gloo, CPU), the last one told of a
preemption mid-epoch. All ranks take one checkpoint at the same batch and exit 0; the next run resumes
at that batch (a resumable data loader) and ends with bit-for-bit the weights of an uninterrupted run.
On the real cluster, with the watcher and a drill: tests/test_multinode_cluster.py."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_preempt.job.checkpoint import CheckpointStore

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="pip install 'slurm-preempt[lightning]'"
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_lightning.py"
STEPS_PER_EPOCH, EPOCHS = 16, 3  # 512 samples, two ranks, batches of 16


def _train(
    tmp_path: Path, ckpt: str, result: str, *extra: str, ranks: int = 2
) -> subprocess.CompletedProcess:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", str(ranks), str(EXAMPLE), "--epochs", str(EPOCHS),
         "--every", "10", "--checkpoint-dir", str(tmp_path / ckpt), "--result", str(tmp_path / result),
         *extra],
        check=False, capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=600,
    )  # fmt: skip


def test_a_notice_mid_epoch_costs_no_batch(tmp_path):
    reference = _train(tmp_path, "ref", "ref.json", "--step-seconds", "0")
    assert reference.returncode == 0, reference.stderr
    told = _train(tmp_path, "run", "run.json", "--step-seconds", "0.05", "--notice-at-step", "21")
    assert told.returncode == 0, told.stderr
    assert not (tmp_path / "run.json").exists()  # it stopped before the end
    final = CheckpointStore(tmp_path / "run").latest()
    assert STEPS_PER_EPOCH < final.step < 2 * STEPS_PER_EPOCH  # mid-epoch, at or soon after step 21
    for rank in (0, 1):
        assert f"rank {rank}: preemption notice" in told.stderr
    resumed = _train(tmp_path, "run", "run.json", "--step-seconds", "0")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {final.step}" in resumed.stderr
    want, got = (json.loads((tmp_path / n).read_text()) for n in ("ref.json", "run.json"))
    assert got["steps"] == want["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert got["weights"] == want["weights"]


def test_a_checkpoint_after_an_epochs_last_batch_resumes_at_the_next_epoch(tmp_path):
    """Lightning resumes a checkpoint taken after an epoch's last batch at the next epoch: the data
    loader's state must say that epoch is over, or the next epoch runs empty (seen on the cluster as
    a run ending 16 steps short). The periodic checkpoint at step 16 falls exactly there."""
    reference = _train(tmp_path, "ref", "ref.json", "--step-seconds", "0")
    assert reference.returncode == 0, reference.stderr
    every_epoch = ("--every", str(STEPS_PER_EPOCH), "--step-seconds")
    told = _train(tmp_path, "run", "run.json", "--notice-at-step", "21", *every_epoch, "0.05")
    assert told.returncode == 0, told.stderr
    store = CheckpointStore(tmp_path / "run")
    assert STEPS_PER_EPOCH in store.steps()
    for path in (tmp_path / "run").glob("step-*"):
        if int(path.name.split("-")[1].split(".")[0]) > STEPS_PER_EPOCH:
            shutil.rmtree(path)  # resume from the end of epoch 0
    resumed = _train(tmp_path, "run", "run.json", *every_epoch, "0")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {STEPS_PER_EPOCH}" in resumed.stderr
    want, got = (json.loads((tmp_path / n).read_text()) for n in ("ref.json", "run.json"))
    assert got["steps"] == want["steps"] == EPOCHS * STEPS_PER_EPOCH
    assert got["weights"] == want["weights"]


def test_three_ranks_told_mid_epoch_resume_on_two_after_the_batches_taken(tmp_path):
    """A job that shrank in place (3 ranks, then 2; tests/test_multinode_cluster.py): the loader's saved
    position counts 3 ranks' batches; on 2 it goes on after the samples taken, in whole batches of 2
    ranks, and the epoch ends where a 2-rank epoch ends (none skipped, fewer than a batch each seen
    twice)."""
    three = STEPS_PER_EPOCH * 2 // 3  # 10 batches of 16 per rank and epoch on 3 ranks
    told = _train(tmp_path, "run", "run.json", "--step-seconds", "0.05", "--notice-at-step", "15", ranks=3)
    assert told.returncode == 0, told.stderr
    final = CheckpointStore(tmp_path / "run").latest()
    assert three < final.step < 2 * three  # mid-epoch 1
    resumed = _train(tmp_path, "run", "run.json", "--step-seconds", "0")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {final.step}" in resumed.stderr
    done_on_two = (final.step - three) * 3 // 2  # batches of 2 ranks the 3 took in epoch 1
    got = json.loads((tmp_path / "run.json").read_text())
    assert got["world"] == 2
    assert got["steps"] == final.step + (STEPS_PER_EPOCH - done_on_two) + (EPOCHS - 2) * STEPS_PER_EPOCH
