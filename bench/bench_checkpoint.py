"""Checkpoint store speed, each figure against a baseline measured in the same run and folder.

    .venv/bin/python bench/bench_checkpoint.py [--quick] [--dir DIR]

- write: a 1 GiB checkpoint (store.save) vs ``dd if=/dev/zero bs=4M count=256 conv=fsync`` in the same
  folder; ratio = checkpoint MB/s / dd MB/s (target >= 0.8).
- async stall: what ``save_async`` makes the caller wait (the snapshot) vs a plain in-memory copy of
  the same state (``bytes(v)`` of every array); ratio = stall / copy (target <= 1.5).
- restore: newest intact checkpoint among 1,000 (list, read manifest, verify, load), in ms.
- checksum: zlib.crc32 MB/s (others listed for the record) vs the fsynced disk write speed.
- SIGKILL trials: savers killed at random points; value = torn or missing checkpoints found (target 0).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from slurm_preempt.job.checkpoint import CheckpointStore

MiB = 1 << 20


def _row(name, value, unit, baseline=None, ratio=None, target=""):
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
    }


def _dd_seconds(folder: Path, mib: int) -> float:
    target = folder / "dd.bin"
    started = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={mib // 4}", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - started
    target.unlink()
    return seconds


def bench_write(folder: Path, mib: int, repeats: int) -> dict:
    block = os.urandom(4 * MiB)
    payload = block * (mib // 4)
    store = CheckpointStore(folder / "write", keep=1)
    ours, theirs = [], []
    for step in range(repeats):
        theirs.append(_dd_seconds(folder, mib))
        started = time.perf_counter()
        store.save(step, payload)
        ours.append(time.perf_counter() - started)
    shutil.rmtree(folder / "write")
    ours_mbs, dd_mbs = mib * MiB / 1e6 / min(ours), mib * MiB / 1e6 / min(theirs)
    return _row(
        f"write {mib} MiB checkpoint", round(ours_mbs), "MB/s", round(dd_mbs), ours_mbs / dd_mbs, ">= 0.8"
    )


def bench_async_stall(folder: Path, mib: int, repeats: int) -> dict:
    state = {f"layer{i}": bytearray(os.urandom(MiB)) * (mib // 16) for i in range(16)}
    store = CheckpointStore(folder / "async", keep=2)
    stalls, copies = [], []
    for step in range(repeats):
        started = time.perf_counter()
        copy = {k: bytes(v) for k, v in state.items()}
        copies.append(time.perf_counter() - started)
        del copy
        started = time.perf_counter()
        store.save_async(step, state)
        stalls.append(time.perf_counter() - started)
        store.wait()
    shutil.rmtree(folder / "async")
    stall, copy_s = statistics.median(stalls), statistics.median(copies)
    return _row(
        f"async save stall, {mib} MiB state",
        round(stall * 1000, 1),
        "ms",
        round(copy_s * 1000, 1),
        stall / copy_s,
        "<= 1.5",
    )


def bench_restore(folder: Path, count: int) -> dict:
    store = CheckpointStore(folder / "many", keep=count)
    for step in range(count):
        store.save(step, {"step": step, "weights": bytes(4096)})
    times = []
    for _ in range(20):
        started = time.perf_counter()
        step, state = store.load_latest()
        times.append(time.perf_counter() - started)
        assert step == count - 1 and state["step"] == step
    shutil.rmtree(folder / "many")
    return _row(f"restore latest among {count} checkpoints", round(statistics.median(times) * 1000, 2), "ms")


def bench_checksum(mib: int, disk_mbs: float) -> list[dict]:
    import hashlib

    data = os.urandom(mib * MiB)
    candidates = {
        "crc32": zlib.crc32,
        "adler32": zlib.adler32,
        "sha256": lambda d: hashlib.sha256(d).digest(),
        "blake2b": lambda d: hashlib.blake2b(d).digest(),
    }
    try:
        import xxhash

        candidates["xxh3_64 (PyPI)"] = lambda d: xxhash.xxh3_64(d).digest()
    except ImportError:
        pass
    rows = []
    for name, func in candidates.items():
        started = time.perf_counter()
        func(data)
        mbs = len(data) / 1e6 / (time.perf_counter() - started)
        target = "> disk write" if name == "crc32" else ""
        rows.append(_row(f"checksum {name}", round(mbs), "MB/s", round(disk_mbs), mbs / disk_mbs, target))
    return rows


SAVER = """
import os, sys
from slurm_preempt.job.checkpoint import CheckpointStore
store, step = CheckpointStore(sys.argv[1], keep=3), int(sys.argv[2])
os.write(1, b"ready\\n")
while True:
    step += 1
    store.save(step, {"a.bin": bytes([step % 251]) * 40_000, "b.bin": str(step).encode() * 5_000})
"""


def bench_kills(folder: Path, trials: int) -> dict:
    script = folder / "saver.py"
    script.write_text(SAVER)
    damaged: list[str] = []
    store = CheckpointStore(folder / "kills", keep=3, warn=damaged.append)
    store.save(0, {"a.bin": bytes(40_000), "b.bin": b"0" * 5_000})
    rng, newest, bad = random.Random(1), 0, 0
    for _ in range(trials):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(folder / "kills"), str(newest)], stdout=subprocess.PIPE
        )
        proc.stdout.readline()
        time.sleep(rng.uniform(0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        found = store.latest()
        want = (
            None
            if found is None
            else {"a.bin": bytes([found.step % 251]) * 40_000, "b.bin": str(found.step).encode() * 5_000}
        )
        if found is None or found.step < newest or (found.step and found.load() != want):
            bad += 1
        newest = found.step if found else newest
    shutil.rmtree(folder / "kills")
    return _row(f"SIGKILL at random points, {trials} trials", bad + len(damaged), "torn or lost", target="0")


def run(quick: bool = False, directory: str | None = None) -> list[dict]:
    folder = Path(
        tempfile.mkdtemp(prefix="bench-checkpoint-", dir=directory or os.environ.get("BENCH_DIR", "/tmp"))
    )
    try:
        write = bench_write(folder, 256 if quick else 1024, 1 if quick else 3)
        rows = [write]
        rows.append(bench_async_stall(folder, 64 if quick else 256, 3 if quick else 5))
        rows.append(bench_restore(folder, 100 if quick else 1000))
        rows.extend(bench_checksum(64 if quick else 256, write["baseline"]))
        rows.append(bench_kills(folder, 50 if quick else 1000))
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Checkpoint store benchmarks")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", help="folder to write in (default /tmp or $BENCH_DIR)")
    args = parser.parse_args()
    for row in run(args.quick, args.dir):
        ratio = "" if row["ratio"] is None else f"ratio {row['ratio']:.2f}"
        base = "" if row["baseline"] is None else f"baseline {row['baseline']}"
        print(
            f"{row['name']:<42} {row['value']:>10} {row['unit']:<13} {base:<18} {ratio:<12} {row['target']}"
        )
