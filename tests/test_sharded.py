"""Sharded checkpoints: real processes, one per rank, meeting through files (FileAgreement) or through
torch.distributed (gloo, with DCP writing the shards). Every rank writes its part, one commit makes the
parts visible together, restore falls back on every rank together, and a rank killed with SIGKILL at
any moment of a save never leaves a checkpoint that some ranks accept and others do not."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.agreement import FileAgreement
from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.formats import ShardedFormat
from slurm_preempt.job.sharded import KIND, ShardedStore, objects_loader, objects_writer, owner_rank

FORK = multiprocessing.get_context("fork")


@contextmanager
def _started(procs: list) -> Iterator[list]:
    """Start the ranks; whatever happens in the test, none outlives it (multiprocessing joins every
    child at exit, so a rank saving forever after a failed assertion would hang the whole session)."""
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
            if proc.pid is not None:
                proc.join()


def _ranks(world: int, target, *args, timeout: float = 60.0) -> list[dict]:
    """Run ``target(rank, world, *args)`` in ``world`` forked processes; their JSON results by rank."""
    out = Path(args[0])
    with _started(
        [FORK.Process(target=_child, args=(target, r, world, *args)) for r in range(world)]
    ) as procs:
        for proc in procs:
            proc.join(timeout)
            assert proc.exitcode == 0, (out / f"error-{procs.index(proc)}").read_text()
    return [json.loads((out / f"result-{r}.json").read_text()) for r in range(world)]


def _child(target, rank: int, world: int, *args) -> None:
    out = Path(args[0])
    try:
        result = target(rank, world, *args)
        (out / f"result-{rank}.json").write_text(json.dumps(result))
        code = 0
    except BaseException:
        (out / f"error-{rank}").write_text(traceback.format_exc())
        code = 1
    os._exit(code)


def _store(work: str, rank: int, world: int, meet: str, keep: int = 3, timeout: float = 30.0):
    agreement = FileAgreement(Path(work) / meet, rank, world, timeout=timeout)
    return ShardedStore(Path(work) / "ckpt", agreement, keep=keep)


def _payload(rank: int, step: int) -> dict:
    return {"rank": rank, "step": step, "blob": bytes([rank % 256]) * (1000 + 37 * step)}


def _restored(rank: int, found) -> dict:
    if found is None:
        return {"step": None}
    checkpoint, payload = found
    assert payload["rank"] == rank and payload["step"] == checkpoint.step  # its own part, of that step
    assert payload["blob"] == _payload(rank, checkpoint.step)["blob"]
    return {"step": checkpoint.step}


# ------------------------------------------------------------------------------------ through files


def _save_steps(rank, world, work, steps, fail_rank=-1, fail_step=-1):
    store = _store(work, rank, world, "meet-save", keep=2)
    outcome = {}
    for step in steps:
        writer = objects_writer(_payload(rank, step), rank)
        if rank == fail_rank and step == fail_step:

            def writer(folder, rank=rank):
                raise OSError(28, "No space left on device")

        try:
            store.save(step, writer, meta={"note": "test"})
            outcome[str(step)] = "saved"
        except CheckpointError as exc:
            outcome[str(step)] = str(exc)
    return outcome


def _restore(rank, world, work, meet="meet-restore", broken_rank=-1, broken_step=-1):
    store = _store(work, rank, world, meet)
    load = objects_loader(rank)
    if rank == broken_rank:
        inner = load

        def load(found):
            if found.step == broken_step:
                raise CheckpointError("this rank cannot read it")
            return inner(found)

    return _restored(rank, store.restore(load))


def test_every_rank_writes_its_part_and_one_commit_shows_them(tmp_path):
    work = str(tmp_path)
    results = _ranks(3, _save_steps, work, [1, 2, 3])
    assert all(r == {"1": "saved", "2": "saved", "3": "saved"} for r in results)
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.steps() == [2, 3]  # keep=2: the store's own pruning
    newest = store.latest()  # the plain store sees a complete, verified checkpoint
    assert newest is not None and newest.kind == KIND and newest.manifest["world"] == 3
    assert sorted(newest.manifest["ranks"]) == ["0", "1", "2"]
    assert {owner_rank(n) for n in newest.manifest["files"] if n.startswith("rank-")} == {0, 1, 2}
    assert not [n for n in os.listdir(tmp_path / "ckpt") if n.startswith(".")]  # nothing left behind
    assert _ranks(3, _restore, work) == [{"step": 3}] * 3


def test_a_rank_that_cannot_write_its_part_stops_the_commit_on_every_rank(tmp_path):
    work = str(tmp_path)
    results = _ranks(3, _save_steps, work, [1, 2, 3], 1, 2)
    assert [r["1"] for r in results] == ["saved"] * 3
    assert "No space left on device" in results[1]["2"]
    assert all("failed on another rank" in r["2"] for r in (results[0], results[2]))
    assert [r["3"] for r in results] == ["saved"] * 3  # the next save works again
    assert CheckpointStore(tmp_path / "ckpt").steps() == [1, 3]
    assert not [n for n in os.listdir(tmp_path / "ckpt") if n.startswith(".")]


def test_damage_seen_by_one_rank_sends_every_rank_back_together(tmp_path, caplog):
    work = str(tmp_path)
    _ranks(3, _save_steps, work, [1, 2])
    damaged = tmp_path / "ckpt" / "step-000000000002" / "rank-00002" / "state.pkl"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    # Each file is checked by one rank only; whichever it is, every rank goes back to step 1.
    assert _ranks(3, _restore, work) == [{"step": 1}] * 3


def test_a_rank_that_cannot_load_sends_every_rank_back_together(tmp_path):
    work = str(tmp_path)
    _ranks(3, _save_steps, work, [1, 2])
    assert _ranks(3, _restore, work, "meet-r", 2, 2) == [{"step": 1}] * 3


def test_no_checkpoint_means_none_on_every_rank(tmp_path):
    assert _ranks(2, _restore, str(tmp_path)) == [{"step": None}] * 2


def test_owner_of_a_file_by_name():
    assert owner_rank("__3_0.distcp") == 3
    assert owner_rank("rank-00002/state.pkl") == 2
    assert owner_rank(".metadata") == 0
    assert owner_rank("lightning.ckpt") == 0
    assert owner_rank("lightning.ckpt/__5_0.distcp") == 5


# ------------------------------------------------------------------------------------ SIGKILL trials


def _save_forever(rank, world, work, meet):
    # A meeting folder of its own per trial: a killed trial leaves its last rounds behind, and
    # FileAgreement counts round N's files, stale ones included.
    store = _store(work, rank, world, meet, keep=2, timeout=60)
    step = (store.store.steps() or [0])[-1]
    while True:
        step += 1
        store.save(step, objects_writer(_payload(rank, step), rank))
        (Path(work) / f"saved-{rank}").write_text(str(step))


def _wait_for_a_save(work: Path, rank: int, procs) -> None:
    deadline = time.monotonic() + 120  # only a hung test gets here; a slow machine just waits
    while not (work / f"saved-{rank}").exists():
        errors = [e.read_text() for e in sorted(work.glob("error-*"))]
        assert not errors, "a rank failed before saving:\n" + "\n".join(errors)
        assert all(p.is_alive() for p in procs), "a rank ended before saving"
        assert time.monotonic() < deadline, "the ranks never saved"
        time.sleep(0.02)


def _one_kill_trial(work: Path, rng: random.Random, trial: int) -> bool:
    world = 3
    for name in (*(f"saved-{r}" for r in range(world)), *(f"error-{r}" for r in range(world))):
        (work / name).unlink(missing_ok=True)
    args = (str(work), f"meet-kill-{trial}")
    with _started(
        [FORK.Process(target=_child, args=(_save_forever, r, world, *args)) for r in range(world)]
    ) as procs:
        # Half the kills strike once a save has completed in this trial, so saves complete however slow
        # the machine is; the other half anywhere from start-up on.
        if rng.random() < 0.5:
            _wait_for_a_save(work, 0, procs)
        time.sleep(rng.uniform(0.05, 0.4))  # a moment anywhere in the saving loop
        victim = rng.randrange(world)
        os.kill(procs[victim].pid, signal.SIGKILL)
        time.sleep(rng.uniform(0, 0.05))
        # (leaving the block kills the others too, each at its own moment: the job dies)
    mid_save = any(n.startswith(".tmp-sharded_") for n in os.listdir(work / "ckpt"))
    meet = f"meet-restore-{trial}"
    results = _ranks(world, _restore, str(work), meet)
    steps = {r["step"] for r in results}
    assert len(steps) == 1, results  # every rank resumed from the same checkpoint
    newest = CheckpointStore(work / "ckpt").latest()  # and the newest visible one is complete
    assert newest is None or (newest.verify() is None and newest.step == steps.pop())
    return mid_save


def test_sigkill_of_a_rank_mid_save_never_splits_the_ranks(tmp_path):
    rng = random.Random(1234)
    interrupted = [_one_kill_trial(tmp_path, rng, trial) for trial in range(100)]
    print(f"{sum(interrupted)} of {len(interrupted)} kills left a save half done")
    assert CheckpointStore(tmp_path / "ckpt").steps(), "no save ever completed: the trials tested nothing"


# ------------------------------------------------------------------------------------ DCP over gloo


def _need_torch() -> None:
    pytest.importorskip(
        "torch.distributed", reason="torch is not installed (pip install slurm-preempt[torch])"
    )


def _gloo(rank: int, world: int, work: str, store_name: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{work}/{store_name}", rank=rank, world_size=world)
    return init_device_mesh("cpu", (world,))


SIZE = 1200


def _weights(mesh, step: int):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.arange(SIZE, dtype=torch.int64) + 1000 * step
    return distribute_tensor(full, mesh, [Shard(0)])


def _dcp_save(rank, world, work, steps):
    import torch.distributed as dist

    from slurm_preempt.job import dcpstate
    from slurm_preempt.job.agreement import TorchAgreement

    mesh = _gloo(rank, world, work, "gloo-save")
    store = ShardedStore(Path(work) / "ckpt", TorchAgreement(), keep=2)
    for step in steps:
        state = {"weights": _weights(mesh, step), "step": step}
        store.save(step, dcpstate.writer(state), fmt=dcpstate.FORMAT)
    dist.destroy_process_group()
    return {"saved": steps}


def _dcp_restore(rank, world, work, store_name):
    import torch
    import torch.distributed as dist

    from slurm_preempt.job import dcpstate
    from slurm_preempt.job.agreement import TorchAgreement

    mesh = _gloo(rank, world, work, store_name)
    store = ShardedStore(Path(work) / "ckpt", TorchAgreement())
    state = {"weights": _weights(mesh, 0), "step": -1}
    found = store.restore(dcpstate.loader(state))
    full = state["weights"].full_tensor()
    local = state["weights"].to_local()
    dist.destroy_process_group()
    if found is None:
        return {"step": None}
    step = found[0].step
    assert state["step"] == step
    assert torch.equal(full, torch.arange(SIZE, dtype=torch.int64) + 1000 * step)
    return {"step": step, "local": local.numel()}


def test_dcp_shards_saved_by_two_ranks_load_on_three(tmp_path):
    _need_torch()
    work = str(tmp_path)
    _ranks(2, _dcp_save, work, [1, 2])
    manifest = CheckpointStore(tmp_path / "ckpt").latest().manifest
    assert manifest["format"] == "dcp" and manifest["world"] == 2
    assert manifest["ranks"]["0"] == [".metadata", "__0_0.distcp"] and manifest["ranks"]["1"] == [
        "__1_0.distcp"
    ]
    results = _ranks(3, _dcp_restore, work, "gloo-restore")
    assert [r["step"] for r in results] == [2, 2, 2]
    assert [r["local"] for r in results] == [SIZE // 3] * 3  # resharded to three ranks


def _dcp_save_forever(rank, world, work):
    from slurm_preempt.job import dcpstate
    from slurm_preempt.job.agreement import TorchAgreement

    mesh = _gloo(rank, world, work, "gloo-kill")
    store = ShardedStore(Path(work) / "ckpt", TorchAgreement(), keep=2)
    step = (store.store.steps() or [0])[-1]
    while True:
        step += 1
        state = {"weights": _weights(mesh, step), "step": step}
        store.save(step, dcpstate.writer(state), fmt=dcpstate.FORMAT)
        (Path(work) / f"saved-{rank}").write_text(str(step))


def test_sigkill_of_a_rank_mid_dcp_save_never_splits_the_ranks(tmp_path):
    _need_torch()
    rng = random.Random(99)
    world, interrupted = 2, 0
    for trial in range(12):
        # A rank that outlived its killed peer by a moment wrote error-N ("Connection reset"): not this
        # trial's failure, so each trial starts without the last one's files.
        for name in ("gloo-kill", *(f"{kind}-{r}" for kind in ("saved", "error") for r in range(world))):
            (tmp_path / name).unlink(missing_ok=True)
        ranks = [
            FORK.Process(target=_child, args=(_dcp_save_forever, r, world, str(tmp_path)))
            for r in range(world)
        ]
        with _started(ranks) as procs:
            _wait_for_a_save(tmp_path, 0, procs)  # let a save or two complete, then strike
            time.sleep(rng.uniform(0, 0.3))
            os.kill(procs[rng.randrange(world)].pid, signal.SIGKILL)
            time.sleep(rng.uniform(0, 0.05))
        interrupted += any(n.startswith(".tmp-sharded_") for n in os.listdir(tmp_path / "ckpt"))
        results = _ranks(world, _dcp_restore, str(tmp_path), f"gloo-restore-{trial}")
        assert len({r["step"] for r in results}) == 1 and results[0]["step"] is not None, results
    print(f"{interrupted} of 12 kills left a DCP save half done")


# ------------------------------------------------------------------------------------ through Run


def _run(tmp_path, **options):
    """A Run outside any job (an empty environment), leaving the test process's signals alone."""
    from slurm_preempt.job.resume import Run, Wiring

    return Run(tmp_path, _wiring=Wiring(environ={}, install_signals=False), **options)


def test_a_whole_checkpoint_run_says_a_sharded_one_needs_sharded(tmp_path):
    from slurm_preempt.job.agreement import SingleProcess

    ShardedStore(tmp_path, SingleProcess()).save(5, objects_writer({"x": 1}, 0))
    with pytest.raises(CheckpointError, match=r"is sharded .* use Run\(format=ShardedFormat\(\)\)"):
        _run(tmp_path).restore()
    with pytest.raises(CheckpointError, match=r"pass restore\(into=state_dict\)"):
        _run(tmp_path, format=ShardedFormat()).restore()


def test_one_rank_run_saves_and_restores_a_sharded_torch_state(tmp_path):
    _need_torch()
    import torch

    run = _run(tmp_path, format=ShardedFormat())
    run.save(7, {"w": torch.arange(10), "note": "seven"})
    again = _run(tmp_path, format=ShardedFormat())
    state = {"w": torch.zeros(10, dtype=torch.int64), "note": ""}
    assert again.restore(into=state) is state and again.step == 7
    assert torch.equal(state["w"], torch.arange(10)) and state["note"] == "seven"


def test_docs_recipe_model_and_adam_come_back_through_dcps_state_dict_helpers(tmp_path):
    """docs/resume.md's recipe on one rank: get_state_dict before each save, set_state_dict after restore."""
    _need_torch()
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        return model, torch.optim.Adam(model.parameters(), lr=0.1)

    def state(model, optim):
        model_sd, optim_sd = get_state_dict(model, optim)
        return {"model": model_sd, "optim": optim_sd}

    model, optim = make()
    for _ in range(3):
        optim.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        optim.step()
    _run(tmp_path, format=ShardedFormat()).save(3, state(model, optim))
    model2, optim2 = make()
    restored = _run(tmp_path, format=ShardedFormat()).restore(into=state(model2, optim2))
    set_state_dict(model2, optim2, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
    assert torch.equal(model.weight, model2.weight) and torch.equal(model.bias, model2.bias)
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(optim.state_dict()["state"][0][key], optim2.state_dict()["state"][0][key])
