"""PyTorch state in the store: streamed without copies, staged once for background saves, mapped on load."""

from __future__ import annotations

import os

import pytest

from iostats import disk_bytes_read, forget_cached
from slurm_preempt.job import torchstate
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.formats import TorchFormat

torch = pytest.importorskip("torch", reason="torch is not installed (pip install slurm-preempt[torch])")

MiB = 1 << 20


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


def test_background_save_snapshots_at_call_time(tmp_path):
    model = _model()
    store = CheckpointStore(tmp_path, format=TorchFormat())
    store.save(1, {"model": model.state_dict(), "epoch": 3}, background=True)
    before = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # training goes on while the background save writes
    store.wait()
    loaded = store.latest().load()
    assert loaded["epoch"] == 3
    assert torch.equal(loaded["model"]["0.weight"], before)


def test_a_restored_state_dict_loads_into_the_model_with_its_module_versions(tmp_path):
    model = _model()
    store = CheckpointStore(tmp_path, format=TorchFormat())
    store.save(1, model.state_dict(), background=True)
    store.wait()
    loaded = store.restore()[1]
    assert loaded._metadata == model.state_dict()._metadata  # BatchNorm's version, for load_state_dict
    fresh = _model()
    with torch.no_grad():
        fresh[0].weight.zero_()
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh[0].weight, model[0].weight)


@pytest.mark.parametrize("background", [False, True])
def test_tied_tensors_stay_tied_and_other_leaves_are_kept(tmp_path, background):
    shared = torch.arange(6.0)
    state = {"a": shared, "b": shared, "nested": [shared[:2], {"n": 1, "s": "x"}], "dtype": torch.float16}
    store = CheckpointStore(tmp_path, format=TorchFormat())
    store.save(1, state, background=background)
    store.wait()
    loaded = store.restore()[1]
    assert loaded["a"].data_ptr() == loaded["b"].data_ptr()
    assert torch.equal(loaded["nested"][0], torch.arange(2.0)) and loaded["nested"][1] == {"n": 1, "s": "x"}
    assert loaded["dtype"] is torch.float16


def test_background_save_copies_mutable_leaves_too(tmp_path):
    counts = [1, 2, 3]
    store = CheckpointStore(tmp_path, format=TorchFormat())
    store.save(1, {"w": torch.zeros(3), "counts": counts}, background=True)
    counts.append(4)
    store.wait()
    assert store.restore()[1]["counts"] == [1, 2, 3]


def test_a_synchronous_save_streams_the_live_tensors(tmp_path, monkeypatch):
    """No clone and no serialisation into memory: torch.save gets the caller's own tensors and writes
    them straight into the checkpoint file."""
    state = {"w": torch.randn(4 * MiB // 4)}
    handed = []
    real_save = torch.save

    def spy(obj, f, *args, **kwargs):
        handed.append((obj, f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", spy)
    CheckpointStore(tmp_path, format=TorchFormat()).save(1, state)
    ((obj, target),) = handed
    assert obj is state and obj["w"] is state["w"]
    assert type(target).__name__ == "DurableWriter"


def test_background_saves_reuse_their_host_buffers():
    staging = torchstate.TorchStaging()
    state = {"w": torch.randn(1000), "b": torch.randn(10)}
    first = staging.copy(state)
    state["w"].add_(1.0)
    second = staging.copy(state)
    assert second["w"].data_ptr() == first["w"].data_ptr()  # the same memory, filled again
    assert torch.equal(second["w"], state["w"])
    third = staging.copy({"w": torch.randn(2000), "b": state["b"]})  # shape changed: a new buffer
    assert third["w"].shape == (2000,) and third["b"].data_ptr() == first["b"].data_ptr()


def test_restored_tensors_are_writable_and_the_checkpoint_stays_as_saved(tmp_path):
    store = CheckpointStore(tmp_path, format=TorchFormat())
    store.save(1, {"w": torch.zeros(1000)})
    loaded = store.restore()[1]
    loaded["w"].add_(1.0)
    assert float(store.restore()[1]["w"].sum()) == 0.0


def test_loading_reads_the_file_from_the_disk_once(tmp_path):
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io here")
    store = CheckpointStore(tmp_path, format=TorchFormat())
    found = store.save(1, {"w": torch.randn(8 * MiB // 4), "v": torch.randn(4 * MiB // 4)})
    forget_cached(found.path)
    before = disk_bytes_read()
    loaded = store.restore()[1]
    assert float(loaded["w"].sum()) != 0.0 and float(loaded["v"].sum()) != 0.0  # every page used
    read = disk_bytes_read() - before
    assert found.nbytes <= read < found.nbytes + 2 * MiB, (
        f"read {read / MiB:.1f} MiB to load {found.nbytes / MiB:.1f}"
    )


def test_a_damaged_torch_checkpoint_falls_back(tmp_path):
    warned = []
    store = CheckpointStore(tmp_path, warn=warned.append, keep=5, format=TorchFormat())
    store.save(1, {"w": torch.zeros(100)})
    found = store.save(2, {"w": torch.ones(100)})
    data = bytearray((found.path / torchstate.FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (found.path / torchstate.FILE).write_bytes(bytes(data))
    found, state = store.restore()
    assert found.step == 1 and float(state["w"].sum()) == 0.0 and len(warned) == 1


def test_save_torch_is_a_deprecated_alias_of_the_torch_format(tmp_path):
    store = CheckpointStore(tmp_path)  # the default format: save_torch still writes torch
    with pytest.warns(DeprecationWarning, match=r"save_torch\(\) is deprecated.*TorchFormat"):
        found = store.save_torch(1, {"w": torch.ones(4)})
    assert found.kind == "torch"
    with pytest.warns(DeprecationWarning):
        assert store.save_torch(2, {"w": torch.zeros(4)}, background=True) is None
    assert store.wait().step == 2 and float(store.restore()[1]["w"].sum()) == 0.0


def test_a_torch_stores_background_saves_copy_into_the_same_host_memory(tmp_path, monkeypatch):
    """The staging memory of one background save is the next one's (no page faults), as before."""
    store = CheckpointStore(tmp_path, format=TorchFormat())
    copies = []
    real_snapshot = torchstate.snapshot

    def spy(state, staging=None):
        copies.append(staging)
        return real_snapshot(state, staging)

    monkeypatch.setattr(torchstate, "snapshot", spy)
    for step in (1, 2):
        store.save(step, {"w": torch.randn(1000)}, background=True)
    store.wait()
    assert copies[0] is not None and copies[0] is copies[1]
