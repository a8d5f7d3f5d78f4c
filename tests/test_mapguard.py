"""Restored views of checkpoint files: zero-copy, and another process truncating, rewriting or replacing
a file under them never kills the restoring process (which would die of SIGBUS on a plain mapping).

Each case restores in a child process (a SIGBUS there shows as its exit status, not as a dead test
run), which has a second process change the file, then reads every byte it restored."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import pytest

from slurm_preempt.job import mapguard
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.commit import step_name

CHANGES = {
    "truncate": "os.truncate(path, 0)",
    "rewrite": "open(path, 'wb').write(b'new')",
    "replace": "open(path + '.x', 'wb').write(b'new'); os.replace(path + '.x', path)",
}

CHILD = """
import os, subprocess, sys
from slurm_preempt.job.checkpoint import CheckpointStore
found, state = CheckpointStore(sys.argv[1]).restore()
{keep}
path = str(found.path / sys.argv[2])
subprocess.run([sys.executable, "-c", "import os; path = " + repr(path) + "; " + sys.argv[3]],
               check=True, timeout=120)
assert os.stat(path).st_size != {size}, "the change happened"
{check}
print("intact")
"""


def _restore_then_change(store_dir, name: str, change: str, keep: str, check: str, size: int):
    code = textwrap.dedent(CHILD).format(keep=keep, check=check, size=size)
    return subprocess.run(
        [sys.executable, "-c", code, str(store_dir), name, change],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_bytes_survive_a_change_of_the_file_by_another_process(tmp_path, change):
    data = os.urandom(3 << 20)
    CheckpointStore(tmp_path).save(1, data)
    keep = "assert isinstance(state, memoryview) and state.readonly"
    check = f"import hashlib; assert hashlib.sha256(state).hexdigest() == {_sha(data)!r}"
    done = _restore_then_change(tmp_path, "data.bin", CHANGES[change], keep, check, len(data))
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "intact" in done.stdout


def test_numpy_arrays_survive_truncation_of_their_buffers(tmp_path):
    np = pytest.importorskip("numpy")
    weights = np.arange(1 << 20, dtype=np.float32)
    CheckpointStore(tmp_path).save(1, {"w": weights})
    keep = "assert not state['w'].flags.writeable"
    check = "import numpy as np; assert (state['w'] == np.arange(1 << 20, dtype=np.float32)).all()"
    done = _restore_then_change(tmp_path, "state.buffers", CHANGES["truncate"], keep, check, weights.nbytes)
    assert done.returncode == 0, (done.returncode, done.stderr)


def test_torch_tensors_survive_truncation_of_their_mapped_file(tmp_path):
    torch = pytest.importorskip("torch")
    from slurm_preempt.job.formats import TorchFormat

    CheckpointStore(tmp_path, format=TorchFormat()).save(1, {"w": torch.arange(1 << 20, dtype=torch.float32)})
    size = (tmp_path / step_name(1) / "state.pt").stat().st_size
    check = "import torch; assert torch.equal(state['w'], torch.arange(1 << 20, dtype=torch.float32))"
    done = _restore_then_change(tmp_path, "state.pt", CHANGES["truncate"], "", check, size)
    assert done.returncode == 0, (done.returncode, done.stderr)


def test_a_file_open_for_writing_elsewhere_is_read_as_a_copy(tmp_path):
    data = os.urandom(1 << 20)
    CheckpointStore(tmp_path).save(1, data)
    path = tmp_path / step_name(1) / "data.bin"
    with open(path, "r+b"):  # a writer holds it: no lease can be had
        before = mapguard.held()
        found, state = CheckpointStore(tmp_path).restore()
        assert mapguard.held() == before and state.readonly and state == data
    os.truncate(path, 0)
    assert state == data


def test_a_lease_is_let_go_once_nothing_maps_the_file(tmp_path):
    # Leases are per process: views restored by earlier tests (a failed test's traceback keeps its
    # frames) may still hold theirs, so count this test's lease from what was held before it.
    gc.collect()
    before = mapguard.held()
    CheckpointStore(tmp_path).save(1, os.urandom(1 << 20))
    _found, state = CheckpointStore(tmp_path).restore()
    assert mapguard.held() >= 1
    state.release()
    del state
    deadline = time.monotonic() + 30
    while mapguard.held() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mapguard.held() <= before


def test_writable_restores_are_copies(tmp_path):
    np = pytest.importorskip("numpy")
    store = CheckpointStore(tmp_path)
    store.save(1, {"w": np.zeros(1000), "raw": b"x"})
    _found, state = store.restore(writable=True)
    state["w"][0] = 1.0
    assert store.restore()[1]["w"][0] == 0.0


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
