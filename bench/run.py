"""Run every benchmark of slurm-preempt and print one table of figures, each against a baseline
measured in the same run, with the machine it ran on.

    .venv/bin/python bench/run.py            # full figures (several minutes; some need root + Slurm)
    .venv/bin/python bench/run.py --quick    # smaller sizes, for a first look
    .venv/bin/python bench/run.py --only checkpoint --json

Each bench/bench_<area>.py exposes ``run(quick: bool = False) -> list[dict]`` returning rows with
``name``, ``value``, ``unit``, ``baseline`` (what the figure is compared with), ``ratio`` and ``target``.
Benchmarks are never run by the test suite: tests check behaviour, these measure speed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # `sinfo --version` of 22.05 needs a readable slurm.conf; the package knows its version anyway.
    try:
        slurm = (
            "slurm "
            + subprocess.run(
                ["dpkg-query", "-W", "-f", "${Version}", "slurm-client"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout.strip()
        )
    except (OSError, subprocess.TimeoutExpired):
        slurm = "slurm: not installed"
    return {
        "host": platform.node(),
        "os": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "slurm": slurm.strip(),
    }


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(HERE))
    spec.loader.exec_module(module)
    return module


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    parser.add_argument("--only", action="append", help="run only bench_<NAME>.py (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    files = sorted(HERE.glob("bench_*.py"))
    if args.only:
        files = [f for f in files if f.stem.removeprefix("bench_") in args.only]
    rows, failures = [], []
    for path in files:
        area = path.stem.removeprefix("bench_")
        began = time.monotonic()
        print(f"running {area} ...", file=sys.stderr, flush=True)
        try:
            for row in load(path).run(quick=args.quick):
                rows.append({"area": area, **row})
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            failures.append({"area": area, "error": f"{type(exc).__name__}: {exc}"})
            traceback.print_exc(file=sys.stderr)
        print(f"  {area} took {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    report = {"machine": machine(), "quick": args.quick, "rows": rows, "failures": failures}
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if failures else 0
    info = report["machine"]
    print(f"machine: {info['cpu']} x{info['cores']}, {info['os']}, Python {info['python']}, {info['slurm']}")
    header = ("area", "figure", "value", "unit", "baseline", "ratio", "target")
    table = [header] + [
        (
            r["area"],
            r["name"],
            fmt(r.get("value")),
            r.get("unit", ""),
            fmt(r.get("baseline")),
            fmt(r.get("ratio")),
            r.get("target") or "",
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
    for failure in failures:
        print(f"FAILED {failure['area']}: {failure['error']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
