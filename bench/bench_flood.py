"""A mass drain told while one user's job folder is flooded (issue 28): as fast as without the flood?

    .venv/bin/python bench/bench_flood.py [--quick]          (root: the flood belongs to a real user)

A watcher (the production one, against the in-memory Slurm of tests/fakeslurm.py, its state and
ledgers in a real folder) polls once after 10 preemptible nodes drain at once under 200 opted-in
jobs of ``sp-alice``, with one job of ``sp-mallory`` among them. Mallory's ledger folder is hers, as
the prolog leaves it, and in the flooded runs holds 10,000 files of 63 KB (quick: 1,000) of
``{"kind": "signal_sent", "p": [{}, {}, ...]}``, named like the very events the watcher looks for (hard
links of one file: the flood costs no disk). Figures: the poll that tells every job (notice files and
signals), median of alternated rounds, flooded against clean; and one ``ledger.events`` read of the
flooded folder (what ``history`` does), which the bounds refuse before parsing anything.

The issue measured the reader before the bounds: 1,000 such files took 5.1 s and 1.1 GB per read, and
the watcher read a job's ledger 2-3 times per tell in its main thread.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent / "tests"))

from fakeslurm import Clock, FakeSlurm  # noqa: E402
from hostileusers import ALICE, MALLORY, ensure_user  # noqa: E402
from slurm_preempt import ledger  # noqa: E402
from slurm_preempt.watch.sentstate import SentState  # noqa: E402
from slurm_preempt.watch.settings import Settings  # noqa: E402
from slurm_preempt.watch.watcher import Watcher  # noqa: E402

NODES = 10
JOBS = 200
FILE_BYTES = 63_000
REASON = "TogetherPreemptionNotified: flood bench"
OPT_IN = "slurm-preempt:signal=USR1"


def _row(name: str, value: float, unit: str, baseline: float | None, target: str) -> dict:
    ratio = round(value / baseline, 2) if baseline else None
    return {"name": name, "value": round(value, 4), "unit": unit, "baseline": baseline, "ratio": ratio,
            "target": target}  # fmt: skip


def _flood(folder: Path, files: int, uid: int) -> None:
    pad = json.dumps({"kind": "signal_sent", "p": [{}] * ((FILE_BYTES - 40) // 4)}).encode()
    first = folder / "0-x-1-signal_sent.json"
    first.write_bytes(pad)
    os.chown(first, uid, uid)
    for index in range(1, files):
        os.link(first, folder / f"{index}-x-1-signal_sent.json")


def one_drain(files: int) -> float:
    """Seconds of the poll that tells every job of a mass drain; ``files``: mallory's flood (0: none)."""
    alice, _ = ensure_user(ALICE)
    mallory, _ = ensure_user(MALLORY)
    state = Path(tempfile.mkdtemp(prefix="bench-flood-"))
    try:
        clock = Clock()
        slurm = FakeSlurm(clock, preemptible=NODES, standard=1)
        for index in range(JOBS):
            job_id = str(1000 + index)
            user, uid = (MALLORY, mallory) if index == JOBS // 2 else (ALICE, alice)
            slurm.add_job(job_id, [f"pre{index % NODES + 1}"], comment=OPT_IN, user=user)
            folder = ledger.job_dir(state, job_id)
            folder.mkdir(parents=True)
            os.chown(folder, uid, uid)  # the prolog's hand-over
            if files and user == MALLORY:
                _flood(folder, files, uid)
        watcher = Watcher(slurm, Settings(interval=1.0), SentState(), state, clock=clock)
        watcher.poll_once()
        slurm.drain([f"pre{i}" for i in range(1, NODES + 1)], REASON)
        started = time.perf_counter()
        watcher.poll_once()
        seconds = time.perf_counter() - started
        told = len(list((state / "notices").iterdir()))
        signalled = {j for call in slurm.called("signal_many") for j in call["job_ids"]}
        if told != JOBS or len(signalled) != JOBS:
            raise RuntimeError(f"told {told} notices and signalled {len(signalled)} of {JOBS} jobs")
        return seconds
    finally:
        shutil.rmtree(state, ignore_errors=True)


def flooded_read(files: int) -> float:
    mallory, _ = ensure_user(MALLORY)
    state = Path(tempfile.mkdtemp(prefix="bench-flood-"))
    try:
        folder = ledger.job_dir(state, "77")
        folder.mkdir(parents=True)
        os.chown(folder, mallory, mallory)
        _flood(folder, files, mallory)
        started = time.perf_counter()
        try:
            ledger.events(state, "77")
        except ledger.LedgerUnreadable:
            pass
        return time.perf_counter() - started
    finally:
        shutil.rmtree(state, ignore_errors=True)


def run(quick: bool = False) -> list[dict]:
    if os.geteuid() != 0:
        raise RuntimeError("bench_flood needs root: the flood belongs to a real user, sp-mallory")
    files = 1_000 if quick else 10_000
    rounds = 5 if quick else 9
    clean, flooded = [], []
    one_drain(0)  # warm-up: imports, users, the worker threads
    for _round in range(rounds):  # alternated, so a busy moment of this shared machine hits both
        clean.append(one_drain(0))
        flooded.append(one_drain(files))
    base = statistics.median(clean)
    return [
        _row(f"mass drain told ({JOBS} jobs, {NODES} nodes), clean folders", base, "s", None, ""),
        _row(
            f"same, one user's folder flooded ({files:,} files of 63 KB)",
            statistics.median(flooded),
            "s",
            round(base, 4),
            "ratio <= 1.2",
        ),
        _row(
            f"ledger.events of the flooded folder ({files:,} files)", flooded_read(files), "s", None, "< 0.5"
        ),
    ]


if __name__ == "__main__":
    import benchargs  # beside this file: sys.path[0] when run as a script

    for row in run(quick=benchargs.quick(__doc__)):
        print(json.dumps(row))
