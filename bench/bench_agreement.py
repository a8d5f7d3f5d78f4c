"""What ``Run.should_checkpoint`` costs a data-parallel loop on N ranks (torch.distributed, gloo, CPU),
against the same loop without it, measured in the same processes, variants alternated, medians.

A step is some compute plus the gradient all-reduce every data-parallel step does. Variants: the bare
loop; ``should_checkpoint`` exchanging flags at every step boundary (``agree_seconds=0``); and the
default, paced exchange (about every 0.2 s of steps, see ``job/pacing.py``). Target: the paced
exchange adds <= 5% to a 2 ms step.

    .venv/bin/python bench/bench_agreement.py [--quick]
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

TARGET = 1.05
VARIANTS = ("bare", "every step", "paced")


def _worker(rank: int, world: int, work: str, steps: int, rounds: int, size: int, spin: float) -> None:
    import torch
    import torch.distributed as dist

    from slurm_preempt.job import settings
    from slurm_preempt.job.resume import Run, Wiring

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work}/store", rank=rank, world_size=world)
    wiring = Wiring(environ={"RANK": str(rank), "WORLD_SIZE": str(world)}, install_signals=False)
    every_step = dataclasses.replace(settings.load(), agree_seconds=0.0)
    runs = {
        "every step": Run(f"{work}/ckpt", settings=every_step, _wiring=wiring),
        "paced": Run(f"{work}/ckpt", _wiring=wiring),
    }
    grad = torch.ones(size)

    def step() -> None:
        end = time.perf_counter() + spin  # the forward and backward pass
        while time.perf_counter() < end:
            pass
        dist.all_reduce(grad)  # the gradient all-reduce of data parallelism

    timings: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for variant in VARIANTS:
            run = runs.get(variant)
            dist.barrier()
            began = time.perf_counter()
            for number in range(1, steps + 1):
                step()
                if run is not None:
                    run.should_checkpoint(number)
            dist.barrier()
            timings[variant].append((time.perf_counter() - began) / steps)
    if rank == 0:
        print(json.dumps({v: statistics.median(t) for v, t in timings.items()}), flush=True)
    dist.destroy_process_group()


def _measure(world: int, steps: int, rounds: int, size: int, spin: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sp-bench-agree-") as work:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(r),
                    str(world),
                    work,
                    str(steps),
                    str(rounds),
                    str(size),
                    str(spin),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )  # fmt: skip
            for r in range(world)
        ]
        outputs = [p.communicate(timeout=1200)[0] for p in procs]
    return json.loads(outputs[0].strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        missing = {"name": "should_checkpoint on N ranks", "value": None, "unit": "", "baseline": "no torch"}
        return [missing]
    steps, rounds = (300, 3) if quick else (1000, 7)
    rows = []
    for world in (2, 4):
        for spin_ms in (2.0, 20.0):
            if quick and spin_ms > 2:
                continue
            got = _measure(world, steps if spin_ms < 10 else steps // 5, rounds, 65536, spin_ms / 1000)
            for variant in ("every step", "paced"):
                rows.append(
                    {
                        "name": f"should_checkpoint, {variant}, {world} ranks, {spin_ms:g} ms compute",
                        "value": round(got[variant] * 1000, 3),
                        "unit": "ms/step",
                        "baseline": f"bare loop {got['bare'] * 1000:.3f} ms/step",
                        "ratio": round(got[variant] / got["bare"], 3),
                        "target": f"<= {TARGET}" if variant == "paced" else "",
                    }
                )
    return rows


if __name__ == "__main__":
    import benchargs  # beside this file: sys.path[0] when run as a script

    if sys.argv[1:2] == ["--worker"]:
        r, w, folder, s, n, size, spin = sys.argv[2:9]
        _worker(int(r), int(w), folder, int(s), int(n), int(size), float(spin))
    else:
        for row in run(quick=benchargs.quick(__doc__)):
            print(json.dumps(row))
