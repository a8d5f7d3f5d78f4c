"""Snapshots: in place for synchronous saves, one reused copy for background saves."""

from __future__ import annotations

import pytest

from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.snapshot import BUFFERS_FILE, BYTES_FILE, Staging, snapshot_of, snapshot_of_paths


def test_a_synchronous_snapshot_refers_to_the_callers_buffers():
    data = bytearray(b"x" * 100)
    assert snapshot_of(data).files[BYTES_FILE][0] is data
    files = snapshot_of({"a.bin": data})
    assert files.kind == "files" and files.files["a.bin"][0] is data


def test_numpy_arrays_are_written_from_their_own_memory():
    np = pytest.importorskip("numpy")
    weights = np.arange(1000, dtype=np.float32)
    snap = snapshot_of({"w": weights, "step": 3})
    (piece,) = snap.files[BUFFERS_FILE]
    assert snap.kind == "pickle" and snap.extra["buffers"] == [4000]
    weights[0] = 7.0
    assert piece.tobytes()[:4] == weights.tobytes()[:4]  # the same memory, not a copy


def test_a_background_snapshot_copies_and_reuses_its_memory():
    staging = Staging()
    data = bytearray(b"1" * 100)
    first = snapshot_of(data, staging).files[BYTES_FILE][0]
    data[:] = b"2" * 100
    assert bytes(first) == b"1" * 100  # a copy: the caller may change its state
    second = snapshot_of(data, staging).files[BYTES_FILE][0]
    assert bytes(second) == b"2" * 100 and second.obj is first.obj  # the same memory, reused
    third = snapshot_of(bytearray(50), staging).files[BYTES_FILE][0]
    assert third.obj is not first.obj  # another size: a new buffer (and the old one released)


def test_names_that_could_escape_or_collide_are_refused(tmp_path):
    for name in ("../x", "/etc/passwd", "MANIFEST.json", ".owner", ""):
        with pytest.raises(CheckpointError):
            snapshot_of({name: b"x"})
    with pytest.raises(CheckpointError):
        snapshot_of_paths([tmp_path / "missing"])
