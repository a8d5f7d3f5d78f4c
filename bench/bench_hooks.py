"""What the hooks add to each job start and end: the installed prolog, epilog, EpilogSlurmctld and
TaskProlog, exec'd as slurmd execs them (no PATH, a real 22.05 environment), against an empty
``#!/bin/sh`` hook measured in the same run. Target: <= 50 ms added per start and per end.

    .venv/bin/python bench/bench_hooks.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from slurm_preempt.admin import hooks  # noqa: E402

ENV_DIR = ROOT / "tests" / "data" / "slurm-22.05" / "hook-env"
TARGET_MS = 50.0


def _env(name: str, job_id: int) -> dict[str, str]:
    lines = (ENV_DIR / f"{name}.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    env["SLURM_JOB_ID"] = env["SLURM_JOBID"] = str(job_id)
    return env


def _time_ms(path: Path, env_name: str, runs: int, first_job: int) -> float:
    samples = []
    for i in range(runs):
        env = _env(env_name, first_job + i)
        began = time.perf_counter()
        subprocess.run(
            [str(path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def run(quick: bool = False) -> list[dict]:
    runs = 30 if quick else 200
    rows = []
    with tempfile.TemporaryDirectory(prefix="sp-bench-hooks-") as scratch:
        prefix, state = Path(scratch) / "etc", Path(scratch) / "state"
        hooks.install(prefix, state)
        empty = Path(scratch) / "empty"
        empty.write_text("#!/bin/sh\nexit 0\n")
        os.chmod(empty, 0o755)
        baseline = _time_ms(empty, "prolog_slurmd", runs, 1)
        # The epilogs write into folders the prolog made: run the prolog first for the same job ids.
        cases = [
            ("prolog (start, per node)", prefix / "prolog.d" / hooks.HOOK_NAME, "prolog_slurmd"),
            ("epilog (end, per node)", prefix / "epilog.d" / hooks.HOOK_NAME, "epilog_slurmd"),
            (
                "EpilogSlurmctld (end, per job)",
                prefix / "slurm-preempt" / "epilog-slurmctld",
                "epilog_slurmctld_failed",
            ),
            ("TaskProlog (start, per task)", prefix / "slurm-preempt" / "taskprolog", "task_prolog"),
        ]
        for name, path, env_name in cases:
            median = _time_ms(path, env_name, runs, 1_000_000)
            added = median - baseline
            rows.append(
                {
                    "name": f"hooks: {name} added",
                    "value": round(added, 2),
                    "unit": "ms",
                    "baseline": f"empty sh hook {baseline:.2f} ms",
                    "ratio": round(median / baseline, 2) if baseline else None,
                    "target": f"<= {TARGET_MS:g} ms",
                }
            )
        # For contrast: what the same hook would cost as a Python script importing the ledger.
        py = Path(scratch) / "pyhook"
        py.write_text(
            f"#!{sys.executable} -S\nimport sys; sys.path.insert(0, {str(ROOT / 'src')!r})\n"
            "from slurm_preempt import ledger\n"
        )
        os.chmod(py, 0o755)
        python_ms = _time_ms(py, "prolog_slurmd", max(10, runs // 5), 2_000_000) - baseline
        start = sum(r["value"] for r in rows if "start" in r["name"])
        end = sum(r["value"] for r in rows if "end" in r["name"])
        for label, value in (
            ("per job start (prolog + TaskProlog)", start),
            ("per job end (both epilogs)", end),
        ):
            rows.append(
                {
                    "name": f"hooks: total {label}",
                    "value": round(value, 2),
                    "unit": "ms",
                    "baseline": f"empty sh hook {baseline:.2f} ms",
                    "ratio": None,
                    "target": f"<= {TARGET_MS:g} ms",
                }
            )
        rows.append(
            {
                "name": "hooks: Python hook importing the ledger (contrast)",
                "value": round(python_ms, 2),
                "unit": "ms",
                "baseline": f"empty sh hook {baseline:.2f} ms",
                "ratio": None,
                "target": "not used: why the hooks are sh",
            }
        )
    return rows


if __name__ == "__main__":
    import benchargs  # beside this file: sys.path[0] when run as a script

    for row in run(quick=benchargs.quick(__doc__)):
        where = f"(baseline {row['baseline']}, target {row['target']})"
        print(f"{row['name']:<58} {row['value']:>8} {row['unit']}  {where}")
