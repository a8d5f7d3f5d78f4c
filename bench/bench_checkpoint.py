"""Checkpoint store speed against its peers, on the same bytes, in the same folder, in the same run.

    .venv/bin/python bench/bench_checkpoint.py [--quick] [--dir DIR] [--rounds N] [--json]

Every figure is a ratio to a baseline measured in the same round: the contenders of a round run one
after the other in an order that rotates from round to round, and each ratio is the median of the
per-round ratios (the spread is their min-max). A machine shared with other work makes single timings
noisy; per-round ratios cancel what the round shares.

- bytes save: ``store.save`` of one buffer vs plain Python ``write`` + ``fsync`` of the same buffer; the
  limit: ``O_DIRECT`` writes of the same (page-aligned) buffer. Target >= 0.9.
- torch save: ``store.save`` (``TorchFormat``) of a state dict vs ``torch.save`` to a file + fsync +
  rename; peers: torch.distributed.checkpoint (DCP) ``save`` and ``async_save`` (to completion).
  Target >= 0.9.
- load: ``store.restore`` (verified) vs a raw read of the same file(s) into memory, page cache
  dropped before each (``posix_fadvise(DONTNEED)``: a restore on a node that did not write it);
  peer: ``torch.load``. Target >= 0.8.
- async stall: what ``save(background=True)`` (torch and pickle formats) makes the caller wait vs a clone of
  every tensor / copy of every array (fresh memory each time); peer: DCP ``async_save``; the best of 3
  of each in a round. The store reuses the copy's memory from one background save to the next, so its
  first save stalls like a clone and the later ones less. Target <= 1.1.
- load from the page cache: ``store.restore`` (verified, a read-only view of the mapped file) vs
  streaming the same bytes through one reused buffer; peer: ``f.read()``. Target >= 0.8 (<= 1.25x the
  time).
- restore among many checkpoints; the checksum (XXH3) vs ``zlib.crc32`` (target >= 3) and vs the plain
  write of this run;
- SIGKILL trials: savers (several MiB, 30% re-saves) killed at random moments; torn or lost: target 0.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from slurm_preempt.job.checkpoint import CheckpointStore
from slurm_preempt.job.formats import PickleFormat, TorchFormat

MiB = 1 << 20
Timed = Callable[[int], float]  # round number -> seconds


def _row(name, value, unit, baseline=None, ratio=None, target="", spread=""):
    return {"name": name, "value": value, "unit": unit, "baseline": baseline, "ratio": ratio,
            "target": target, "spread": spread}  # fmt: skip


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _alternate(contenders: dict[str, Timed], rounds: int) -> dict[str, list[float]]:
    """Seconds of each contender in each round; the order rotates so none always goes first."""
    names = list(contenders)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(rounds):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            seconds[name].append(contenders[name](turn))
    return seconds


def _ratios(seconds, top: str, bottom: str) -> tuple[float, str]:
    """Median and min-max of per-round seconds[top] / seconds[bottom]."""
    per_round = [a / b for a, b in zip(seconds[top], seconds[bottom], strict=True)]
    return statistics.median(per_round), f"{min(per_round):.2f}-{max(per_round):.2f}"


def _speed_rows(
    section: str, seconds, nbytes: int, ours: str, baseline: str, peers: list[str], target: str
) -> list[dict]:
    """Rows of MB/s, each contender's speed as a ratio to the baseline's."""
    rows = []
    for name in [ours, *peers]:
        ratio, spread = _ratios(seconds, baseline, name)
        mbs = nbytes / 1e6 / statistics.median(seconds[name])
        base = nbytes / 1e6 / statistics.median(seconds[baseline])
        rows.append(_row(f"{section}: {name}", round(mbs), "MB/s", f"{baseline} {base:.0f}", round(ratio, 2),
                         target if name == ours else "", spread))  # fmt: skip
    return rows


def _drop_cache(*paths: Path) -> None:
    """Forget the cached pages of these files (clean after fsync): the next read comes from the disk."""
    for path in paths:
        for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _aligned_payload(nbytes: int):
    import mmap

    buffer = mmap.mmap(-1, nbytes)  # page-aligned, so O_DIRECT can write it as it is
    block = os.urandom(4 * MiB)
    for start in range(0, nbytes, len(block)):
        buffer[start : start + len(block)] = block[: nbytes - start]
    return buffer


# ---------------------------------------------------------------------------------------- bytes


def bench_bytes_save(folder: Path, mib: int, rounds: int) -> list[dict]:
    data = _aligned_payload(mib * MiB)
    store = CheckpointStore(folder / "store", keep=1)
    target = folder / "plain.bin"

    def plain(_turn):
        seconds = _timed(lambda: _plain_write(target, data))
        target.unlink()
        return seconds

    def direct(_turn):
        seconds = _timed(lambda: _direct_write(target, data))
        target.unlink()
        return seconds

    def ours(turn):
        seconds = _timed(lambda: store.save(turn, data))
        store.settle()  # pruning the previous one: after the save returned, off the caller's path
        return seconds

    def bounced(_turn):
        seconds = _timed(lambda: _direct_bounced_write(target, memoryview(data)[1:]))
        target.unlink()
        return seconds

    contenders: dict[str, Timed] = {"write+fsync": plain, "store.save": ours, "O_DIRECT": direct}
    contenders["O_DIRECT, bounce-buffered"] = bounced  # what the store would do with a user's buffer
    if _has("numpy"):  # the same bytes as a dict of arrays: Run.save's default (pickled) path
        import numpy

        arrays = numpy.frombuffer(data, dtype=numpy.uint8).reshape(16, -1)
        state = {f"layer{i}": arrays[i] for i in range(16)}

        def ours_numpy(turn):
            seconds = _timed(lambda: store.save(turn, state))
            store.settle()
            return seconds

        contenders["store.save (numpy state)"] = ours_numpy
    if not _direct_supported(folder):
        contenders = {k: v for k, v in contenders.items() if not k.startswith("O_DIRECT")}
    seconds = _alternate(contenders, rounds)
    shutil.rmtree(folder / "store")
    peers = [p for p in contenders if p not in ("write+fsync", "store.save")]
    return _speed_rows(
        f"bytes save {mib} MiB", seconds, mib * MiB, "store.save", "write+fsync", peers, ">= 0.9"
    )


def _plain_write(path: Path, data) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _direct_write(path: Path, data) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        view = memoryview(data)
        for start in range(0, len(view), 8 * MiB):
            os.write(fd, view[start : start + 8 * MiB])
        os.fsync(fd)
    finally:
        os.close(fd)


def _direct_bounced_write(path: Path, view: memoryview, chunk: int = 8 * MiB) -> None:
    """O_DIRECT from memory that is not page-aligned: copy (and checksum) each chunk into one of two
    aligned buffers while the other is written; pad the tail and cut the file to size."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    buffers, crc, pending = [mmap.mmap(-1, chunk), mmap.mmap(-1, chunk)], 0, None
    try:
        with ThreadPoolExecutor(1) as pool:
            for turn, start in enumerate(range(0, len(view), chunk)):
                part, buffer = view[start : start + chunk], buffers[turn % 2]
                if pending is not None and turn >= 2:
                    pending.result()
                buffer[: len(part)] = part
                crc = zlib.crc32(part, crc)
                padded = -(-len(part) // 4096) * 4096
                if pending is not None:
                    pending.result()
                pending = pool.submit(os.write, fd, memoryview(buffer)[:padded])
            if pending is not None:
                pending.result()
        os.ftruncate(fd, len(view))
        os.fsync(fd)
    finally:
        os.close(fd)


def _direct_supported(folder: Path) -> bool:
    try:
        fd = os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    (folder / "probe").unlink()
    return True


def bench_parallel_files(folder: Path, mib: int, rounds: int) -> list[dict]:
    """Four files of a checkpoint written one after the other (as the store does) or by four threads."""
    from slurm_preempt.job.checkpoint_io import write_file

    parts = [os.urandom(mib * MiB // 4) for _ in range(4)]

    def written(threads: bool) -> Timed:
        def run(turn):
            paths = [folder / f"part-{turn}-{i}" for i in range(4)]
            if threads:
                workers = [
                    threading.Thread(target=write_file, args=(p, [d]))
                    for p, d in zip(paths, parts, strict=True)
                ]

                def action():
                    for worker in workers:
                        worker.start()
                    for worker in workers:
                        worker.join()

            else:

                def action():
                    for path, data in zip(paths, parts, strict=True):
                        write_file(path, [data])

            seconds = _timed(action)
            for path in paths:
                path.unlink()
            return seconds

        return run

    seconds = _alternate({"one after the other": written(False), "4 threads": written(True)}, rounds)
    section = f"4 files of {mib // 4} MiB"
    return _speed_rows(section, seconds, mib * MiB, "4 threads", "one after the other", [], "")


# ---------------------------------------------------------------------------------------- torch


def _torch_state(mib: int):
    import torch

    torch.manual_seed(0)
    return {f"layer{i}.weight": torch.randn(mib * MiB // 4 // 16) for i in range(16)}


def bench_torch_save(folder: Path, mib: int, rounds: int) -> list[dict]:
    import torch
    import torch.distributed.checkpoint as dcp

    state = _torch_state(mib)
    store = CheckpointStore(folder / "store", keep=1, format=TorchFormat())

    def torch_save(turn):
        final, tmp = folder / f"state-{turn}.pt", folder / f"state-{turn}.pt.tmp"

        def save():
            torch.save(state, tmp)
            _fsync_path(tmp)
            os.rename(tmp, final)
            _fsync_path(folder, directory=True)

        seconds = _timed(save)
        final.unlink()
        return seconds

    def ours(turn):
        seconds = _timed(lambda: store.save(turn, state))
        store.settle()
        return seconds

    def dcp_sync(turn):
        seconds = _timed(lambda: dcp.save(state, checkpoint_id=str(folder / f"dcp-{turn}")))
        shutil.rmtree(folder / f"dcp-{turn}")
        return seconds

    def dcp_async(turn):
        seconds = _timed(lambda: dcp.async_save(state, checkpoint_id=str(folder / f"dcpa-{turn}")).result())
        shutil.rmtree(folder / f"dcpa-{turn}")
        return seconds

    contenders = {"torch.save+fsync+rename": torch_save, "store.save (torch)": ours,
                  "DCP save": dcp_sync, "DCP async_save (to completion)": dcp_async}  # fmt: skip
    with _quiet():
        seconds = _alternate(contenders, rounds)
    shutil.rmtree(folder / "store")
    peers = ["DCP save", "DCP async_save (to completion)"]
    baseline = "torch.save+fsync+rename"
    return _speed_rows(
        f"torch state {mib} MiB", seconds, mib * MiB, "store.save (torch)", baseline, peers, ">= 0.9"
    )


# ---------------------------------------------------------------------------------------- load


def bench_load(folder: Path, mib: int, rounds: int, payload: str) -> list[dict]:
    fmt = TorchFormat() if payload == "torch" else PickleFormat()
    store = CheckpointStore(folder / f"load-{payload}", keep=1, format=fmt)
    if payload == "torch":
        found = store.save(1, _torch_state(mib))
    elif payload == "numpy":
        import numpy

        found = store.save(1, {f"a{i}": numpy.random.rand(mib * MiB // 8 // 16) for i in range(16)})
    else:
        found = store.save(1, os.urandom(mib * MiB))
    files = [found.path / name for name in found.manifest["files"]]

    def raw(_turn):
        _drop_cache(found.path)

        def read():
            for file in files:
                with open(file, "rb") as handle:
                    _touch(handle.read())

        return _timed(read)

    def ours(_turn):
        _drop_cache(found.path)
        return _timed(lambda: _touch(store.restore()[1]))

    def torch_load(_turn):
        import torch

        _drop_cache(found.path)
        return _timed(lambda: _touch(torch.load(files[0], weights_only=False)))

    contenders: dict[str, Timed] = {"raw read": raw, "store.restore": ours}
    if payload == "torch":
        contenders["torch.load"] = torch_load
    seconds = _alternate(contenders, rounds)
    shutil.rmtree(folder / f"load-{payload}")
    peers = [p for p in contenders if p == "torch.load"]
    section = f"load {payload} {mib} MiB (cold cache)"
    return _speed_rows(section, seconds, found.nbytes, "store.restore", "raw read", peers, ">= 0.8")


def _touch(state) -> None:
    """Use what was loaded: every byte read once, the same way for every contender (pages of a mapped
    file are faulted in here, as they would be when the job first uses them)."""
    values = state.values() if isinstance(state, dict) else [state]
    for value in values:
        data = value.numpy() if hasattr(value, "numpy") else value
        zlib.adler32(memoryview(data).cast("B"))


# ---------------------------------------------------------------------------------------- stalls


def bench_stall(folder: Path, mib: int, rounds: int, payload: str) -> list[dict]:
    fmt = TorchFormat() if payload == "torch" else PickleFormat()
    store = CheckpointStore(folder / f"stall-{payload}", keep=2, format=fmt)
    if payload == "torch":
        state = _torch_state(mib)
        copy_name = "tensor clone"

        def copy():
            return {k: v.clone() for k, v in state.items()}

    else:
        import numpy

        state = {f"a{i}": numpy.random.rand(mib * MiB // 8 // 16) for i in range(16)}
        copy_name = "array copy"

        def copy():
            return {k: v.copy() for k, v in state.items()}

    def baseline(_turn):
        return _timed(copy)

    def ours(turn):
        seconds = _timed(lambda: store.save(turn, state, background=True))
        store.settle()  # the write itself is not the stall
        return seconds

    # Stalls last tens of ms, where one burst of another process on the machine can double a timing:
    # each contender's best of STALL_TRIES in a round (the same for all), then the per-round ratio.
    contenders: dict[str, Timed] = {copy_name: _best(baseline), "store stall": _best(ours)}
    if payload == "torch":
        contenders["DCP async_save stall"] = _best(lambda turn: _dcp_stall(state, folder / f"dcps-{turn}"))
    with _quiet():
        seconds = _alternate(contenders, rounds)
    shutil.rmtree(folder / f"stall-{payload}")
    rows = []
    for name in [n for n in contenders if n != copy_name]:
        ratio, spread = _ratios(seconds, name, copy_name)
        value = round(statistics.median(seconds[name]) * 1000, 1)
        base = f"{copy_name} {statistics.median(seconds[copy_name]) * 1000:.0f} ms"
        target = "<= 1.1" if name == "store stall" else ""
        label = f"async stall, {payload} {mib} MiB: {name}"
        rows.append(_row(label, value, "ms", base, round(ratio, 2), target, spread))
    return rows


STALL_TRIES = 3


def _best(timed: Timed) -> Timed:
    return lambda turn: min(timed(turn * STALL_TRIES + i) for i in range(STALL_TRIES))


def _dcp_stall(state, where: Path) -> float:
    import torch.distributed.checkpoint as dcp

    future = None

    def start():
        nonlocal future
        future = dcp.async_save(state, checkpoint_id=str(where))

    seconds = _timed(start)
    future.result()  # type: ignore[union-attr]
    shutil.rmtree(where)
    return seconds


@contextlib.contextmanager
def _quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that no process group is initialised
        yield


# ---------------------------------------------------------------------------------------- the rest


def bench_restore(folder: Path, count: int) -> dict:
    store = CheckpointStore(folder / "many", keep=count)
    for step in range(count):
        store.save(step, {"step": step, "weights": bytes(4096)})
    store.settle()
    times = []
    for _ in range(20):
        started = time.perf_counter()
        found, state = store.restore()
        times.append(time.perf_counter() - started)
        assert found.step == count - 1 and state["step"] == found.step
    shutil.rmtree(folder / "many")
    return _row(f"restore latest among {count} checkpoints", round(statistics.median(times) * 1000, 2), "ms")


def bench_checksum(mib: int, rounds: int, write_mbs: float) -> list[dict]:
    """The store's checksum (XXH3) vs zlib.crc32 on the same bytes, alternated; one core each."""
    from slurm_preempt.job import checksum

    data = os.urandom(mib * MiB)
    seconds = _alternate(
        {
            "zlib.crc32": lambda _turn: _timed(lambda: zlib.crc32(data)),
            checksum.DEFAULT: lambda _turn: _timed(lambda: checksum.of(data)),
        },
        rounds,
    )
    rows = _speed_rows(
        f"checksum {mib} MiB (one core)", seconds, len(data), checksum.DEFAULT, "zlib.crc32", [], ">= 3"
    )
    mbs = rows[0]["value"]
    rows.append(_row(f"checksum {checksum.DEFAULT} vs the plain write of this run", mbs, "MB/s",
                     f"plain write {write_mbs:.0f}", round(mbs / write_mbs, 2)))  # fmt: skip
    return rows


def bench_warm_restore(folder: Path, mib: int, rounds: int) -> list[dict]:
    """``store.restore`` (verified) of bytes whose pages are cached vs streaming the same bytes through
    one reused buffer; peer: ``f.read()`` into one new object. Every contender touches every byte once."""
    store = CheckpointStore(folder / "warm", keep=1)
    found = store.save(1, os.urandom(mib * MiB))
    file = found.path / "data.bin"
    buffer = bytearray(8 * MiB)

    def streaming(_turn):
        def read():
            with open(file, "rb", buffering=0) as handle:
                while count := handle.readinto(buffer):
                    zlib.adler32(memoryview(buffer)[:count])

        return _timed(read)

    def whole(_turn):
        return _timed(lambda: _touch(file.read_bytes()))

    def ours(_turn):
        return _timed(lambda: _touch(store.restore()[1]))

    contenders: dict[str, Timed] = {"streaming": streaming, "store.restore": ours, "f.read()": whole}
    seconds = _alternate(contenders, rounds)
    shutil.rmtree(folder / "warm")
    section = f"load bytes {mib} MiB (page cache)"
    return _speed_rows(section, seconds, found.nbytes, "store.restore", "streaming", ["f.read()"], ">= 0.8")


def _kill_payload(step: int, seq: int, size: int) -> dict:
    return {"a.bin": bytes([seq % 251]) * size, "tag.txt": f"{step}:{seq}".encode()}


def bench_kills(folder: Path, trials: int, size: int) -> dict:
    """Savers SIGKILLed at random moments, 30% of saves re-saving a step; bad = a restore that finds
    nothing, a torn checkpoint, or one older than the last save that returned."""
    directory = folder / "kills"
    damaged: list[str] = []
    CheckpointStore(directory).save(0, _kill_payload(0, 0, size), meta={"seq": 0})
    rng, bad, step, seq, restored = random.Random(1), 0, 0, 1, (0, 0)
    for trial in range(trials):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                _saver(directory, step, seq, size, random.Random(trial), write_end)
            finally:
                os._exit(0)
        os.close(write_end)
        time.sleep(rng.uniform(0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with os.fdopen(read_end) as lines:
            done = [tuple(map(int, line.split())) for line in lines]
        last = done[-1] if done else restored
        found = CheckpointStore(directory, warn=damaged.append).latest()
        if found is None or (found.step, found.meta["seq"]) < last:
            bad += 1
            continue
        if found.load() != _kill_payload(found.step, found.meta["seq"], size):
            bad += 1
        restored = (found.step, found.meta["seq"])
        step, seq = found.step, max(seq, last[1]) + 2
    shutil.rmtree(directory)
    name = f"SIGKILL at random points, {trials} trials, {size // MiB} MiB, 30% re-saves"
    return _row(name, bad + len(damaged), "torn or lost", target="0")


def _saver(directory: Path, step: int, seq: int, size: int, rng: random.Random, out: int) -> None:
    store = CheckpointStore(directory, keep=3)
    while True:
        step += 1 if rng.random() < 0.7 else 0
        store.save(step, _kill_payload(step, seq, size), meta={"seq": seq})
        os.write(out, f"{step} {seq}\n".encode())
        seq += 1


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run(quick: bool = False, directory: str | None = None, rounds: int | None = None) -> list[dict]:
    folder = Path(
        tempfile.mkdtemp(prefix="bench-checkpoint-", dir=directory or os.environ.get("BENCH_DIR", "/tmp"))
    )
    rounds = rounds or (3 if quick else 9)
    big, torch_mib = (256, 128) if quick else (1024, 512)
    try:
        rows = bench_bytes_save(folder, big, rounds)
        write_mbs = rows[0]["value"] / rows[0]["ratio"]
        rows += bench_parallel_files(folder, big, rounds)
        if _has("torch"):
            rows += bench_torch_save(folder, torch_mib, rounds)
        rows += bench_warm_restore(folder, torch_mib, rounds)
        rows += bench_load(folder, torch_mib, rounds, "bytes")
        if _has("numpy"):
            rows += bench_load(folder, torch_mib, rounds, "numpy")
        if _has("torch"):
            rows += bench_load(folder, torch_mib, rounds, "torch")
            rows += bench_stall(folder, torch_mib // 2, rounds, "torch")
        if _has("numpy"):
            rows += bench_stall(folder, torch_mib // 2, rounds, "numpy")
        rows.append(bench_restore(folder, 100 if quick else 1000))
        rows += bench_checksum(64 if quick else 256, rounds, write_mbs)
        rows.append(bench_kills(folder, 100 if quick else 1000, 4 * MiB))
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _print(rows: list[dict]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import machine

    info = machine()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {info['host']}, {info['cpu']} x{info['cores']}, {info['os']}, Python {info['python']}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; load average at the end {load}")
    for row in rows:
        ratio = "" if row["ratio"] is None else f"ratio {row['ratio']:.2f}"
        spread = f"({row['spread']})" if row.get("spread") else ""
        base = "" if row["baseline"] is None else f"vs {row['baseline']}"
        figure = f"{row['name']:<62} {row['value']:>8} {row['unit']:<12} {base:<34}"
        print(f"{figure} {ratio:<11} {spread:<12} {row['target']}")


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Checkpoint store benchmarks")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", help="folder to write in (default /tmp or $BENCH_DIR)")
    parser.add_argument("--rounds", type=int, help="rounds of alternated contenders (default 9, quick 3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.quick, args.dir, args.rounds)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        _print(results)
