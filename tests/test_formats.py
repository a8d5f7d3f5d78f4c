"""The checkpoint formats: one object per way of writing, so that no two ways can be asked for at once,
and each way writes the kind of checkpoint it says (read back by its manifest's kind)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.formats import PickleFormat, ShardedFormat, TorchFormat
from slurm_preempt.job.snapshot import Staging


def test_impossible_combinations_cannot_be_written(tmp_path):
    with pytest.raises(TypeError):
        ShardedFormat(background=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        PickleFormat(True)  # type: ignore[misc]  # keyword only: background=True
    with pytest.raises(CheckpointError, match="every rank together"):
        CheckpointStore(tmp_path, format=ShardedFormat())  # type: ignore[arg-type]
    with pytest.raises(FrozenInstanceError):
        TorchFormat().background = True  # type: ignore[misc]
    assert not PickleFormat().background and TorchFormat(background=True).background
    assert ShardedFormat.sharded and not ShardedFormat.background


def test_the_pickle_format_writes_bytes_files_or_a_pickle_from_where_they_are():
    data = bytearray(b"x" * 100)
    assert PickleFormat().snapshot(data).files["data.bin"][0] is data  # no copy
    assert PickleFormat().snapshot({"a.bin": b"a"}).kind == "files"
    assert PickleFormat().snapshot({"step": 3}).kind == "pickle"
    staged = PickleFormat().snapshot(data, Staging())  # a background save copies
    assert staged.files["data.bin"][0] is not data and bytes(staged.files["data.bin"][0]) == bytes(data)


def test_each_store_format_writes_its_kind_and_any_store_reads_it(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install slurm-preempt[torch])")
    CheckpointStore(tmp_path, format=TorchFormat()).save(1, {"w": torch.ones(3)})
    found, state = CheckpointStore(tmp_path).restore()  # a default (pickle) store reads it by its kind
    assert found.kind == "torch" and torch.equal(state["w"], torch.ones(3))
    CheckpointStore(tmp_path).save(2, {"w": [1.0, 1.0, 1.0]})
    assert CheckpointStore(tmp_path, format=TorchFormat()).restore()[0].kind == "pickle"


def test_the_torch_format_loads_torch_only_when_it_saves(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from slurm_preempt.job.formats import TorchFormat, ShardedFormat;"
        "TorchFormat(background=True); ShardedFormat(); assert 'torch' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
