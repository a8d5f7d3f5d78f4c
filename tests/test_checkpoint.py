"""The checkpoint store: complete or invisible, verified, falls back, keeps K, saves in the background."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.checkpoint import MANIFEST, CheckpointStore, step_name


class Warnings(list):
    def __call__(self, message):
        self.append(message)


@pytest.fixture
def warned():
    return Warnings()


def test_first_run_has_no_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path / "none")
    assert store.latest() is None
    assert store.load_latest() is None


def test_bytes_files_objects_and_paths_round_trip(tmp_path):
    store = CheckpointStore(tmp_path, keep=10)
    store.save(1, b"raw bytes")
    store.save(2, {"model.bin": b"m" * 1000, "opt.bin": bytearray(b"o" * 10)})
    state = {"step": 3, "weights": bytearray(os.urandom(100_000)), "names": ["a", "b"]}
    store.save(3, state)
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "x.txt").write_text("x")
    (tmp_path / "state.txt").write_text("42")
    store.save_paths(4, [tmp_path / "state.txt", tmp_path / "src"])

    assert store.open(1).load() == b"raw bytes"
    assert store.open(2).load() == {"model.bin": b"m" * 1000, "opt.bin": b"o" * 10}
    assert store.open(3).load() == state
    latest = store.latest()
    assert latest.step == 4
    assert (latest.path / "state.txt").read_text() == "42"
    assert (latest.path / "src" / "sub" / "x.txt").read_text() == "x"
    assert set(latest.manifest["files"]) == {"state.txt", "src/sub/x.txt"}


def test_keeps_the_last_k(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for step in range(1, 6):
        store.save(step, str(step).encode())
    assert store.steps() == [4, 5]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(7, b"first")
    store.save(7, b"second")
    assert store.load_latest() == (7, b"second")


def test_meta_is_kept_in_the_manifest(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, b"x", meta={"num_nodes": 2})
    manifest = json.loads((tmp_path / step_name(1) / MANIFEST).read_text())
    assert manifest["meta"] == {"num_nodes": 2}
    assert manifest["files"]["data.bin"]["bytes"] == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_manifest", "delete_file", "garble_manifest"])
def test_damaged_newest_falls_back_with_a_warning(tmp_path, warned, damage):
    store = CheckpointStore(tmp_path, keep=5, warn=warned)
    store.save(1, {"a.bin": b"a" * 5000, "b.bin": b"b" * 5000})
    store.save(2, {"a.bin": b"A" * 5000, "b.bin": b"B" * 5000})
    newest = tmp_path / step_name(2)
    if damage == "flip":
        data = bytearray((newest / "b.bin").read_bytes())
        data[1234] ^= 0x01
        (newest / "b.bin").write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(newest / "a.bin", 100)
    elif damage == "delete_manifest":
        (newest / MANIFEST).unlink()
    elif damage == "delete_file":
        (newest / "a.bin").unlink()
    else:
        (newest / MANIFEST).write_text('{"step": 2, "fil')
    found = store.latest()
    assert found.step == 1
    assert found.load() == {"a.bin": b"a" * 5000, "b.bin": b"b" * 5000}
    assert len(warned) == 1 and step_name(2) in warned[0] and "damaged" in warned[0]


def test_every_checkpoint_damaged_means_none(tmp_path, warned):
    store = CheckpointStore(tmp_path, warn=warned)
    store.save(1, b"x")
    (tmp_path / step_name(1) / "data.bin").write_bytes(b"y")
    assert store.latest() is None
    assert len(warned) == 1


def test_async_save_snapshots_at_call_time(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    state = {"w": bytearray(b"1" * 1_000_000)}
    store.save_async(1, state)
    state["w"][:] = b"2" * 1_000_000  # the caller goes on training while the save runs
    store.save_async(2, state)  # one save in flight: this waits for the first
    store.wait()
    assert store.open(1).load()["w"] == b"1" * 1_000_000
    assert store.open(2).load()["w"] == b"2" * 1_000_000


def test_async_error_surfaces_on_the_next_call(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = CheckpointStore(blocker / "ckpt")
    store.save_async(1, b"x")  # fails in the background
    with pytest.raises(CheckpointError, match="background save failed"):
        store.save_async(2, b"y")
    store.wait()  # the error was reported once, not again


def test_bad_names_are_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError):
        store.save(1, {"../escape": b"x"})
    with pytest.raises(CheckpointError):
        store.save_paths(1, [tmp_path / "missing"])


def test_leftovers_of_dead_savers_are_swept(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, b"x")
    child = subprocess.Popen(["true"])
    child.wait()
    from slurm_preempt.job.checkpoint import _HOST

    stale = tmp_path / f".tmp-{_HOST}-{child.pid}-2-1"
    stale.mkdir()
    (stale / "data.bin").write_bytes(b"half")
    store.save(2, b"y")
    assert not stale.exists()


# ------------------------------------------------------------------------------ SIGKILL at random points

SAVER = """
import os, sys
from slurm_preempt.job.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1], keep=3)
step = int(sys.argv[2])
def payload(step):
    return {"a.bin": bytes([step % 251]) * 40_000, "b.bin": str(step).encode() * 5_000}
os.write(1, b"ready\\n")
while True:
    step += 1
    store.save(step, payload(step), meta={"step": step})
"""


def _payload(step: int) -> dict:
    return {"a.bin": bytes([step % 251]) * 40_000, "b.bin": str(step).encode() * 5_000}


def test_sigkill_at_random_points_never_leaves_a_torn_checkpoint(tmp_path, warned):
    """200 savers killed at random moments: restore always finds a complete, verified checkpoint that
    is the last one known durable or a newer one."""
    import sys

    rng = random.Random(4)
    directory = tmp_path / "ckpt"
    store = CheckpointStore(directory, keep=3, warn=warned)
    store.save(0, _payload(0))
    newest = 0
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    for _trial in range(200):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(directory), str(newest)], stdout=subprocess.PIPE
        )
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        found = store.latest()
        assert found is not None, "restore found nothing after a kill"
        assert found.step >= newest, "restore went back past a durable checkpoint"
        assert found.load() == _payload(found.step)
        newest = found.step
    assert warned == [], f"a torn checkpoint was visible: {warned[:3]}"
    assert newest > 50  # the kills did land at many different points of many saves


# ------------------------------------------------------------------------------ disk full


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False, capture_output=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_is_a_clear_error_and_the_previous_checkpoint_survives(small_tmpfs):
    store = CheckpointStore(small_tmpfs / "ckpt", keep=3)
    store.save(1, os.urandom(300_000))
    before = store.open(1).load()
    with pytest.raises(CheckpointError, match="disk full") as caught:
        store.save(2, os.urandom(900_000))
    assert step_name(1) in str(caught.value) and "intact" in str(caught.value)
    assert store.load_latest() == (1, before)
    assert os.listdir(small_tmpfs / "ckpt") == [step_name(1)]  # no half-written leftovers
    store.save(3, b"small")  # space is back once the failed save is cleaned up
    assert store.latest().step == 3


def test_disk_full_in_the_background_surfaces_on_the_next_call(small_tmpfs):
    store = CheckpointStore(small_tmpfs / "ckpt")
    store.save(1, b"ok")
    store.save_async(2, bytearray(2_000_000))
    with pytest.raises(CheckpointError, match="disk full"):
        store.wait()
    assert store.latest().step == 1


def test_checkpoint_paths_are_plain_folders(tmp_path):
    store = CheckpointStore(tmp_path)
    found = store.save(12, b"x")
    assert found.path == Path(tmp_path) / "step-000000000012"
    assert found.nbytes == 1


def test_saving_an_older_step_warns(tmp_path, warned):
    store = CheckpointStore(tmp_path, warn=warned)
    store.save(10, b"x")
    store.save(1, b"y")
    assert "holds step 10" in warned[0]
    assert store.latest().step == 10


def test_torch_state_dicts(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install slurm-preempt[torch])")
    model = torch.nn.Linear(4, 2)
    store = CheckpointStore(tmp_path)
    store.save_torch(1, {"model": model.state_dict(), "epoch": 3}, background=True)
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on while the background save writes the snapshot
    store.wait()
    loaded = store.latest().load()
    assert loaded["epoch"] == 3
    assert torch.equal(loaded["model"]["weight"] + 1.0, model.weight.detach())
