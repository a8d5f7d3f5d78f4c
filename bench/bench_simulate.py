"""``slurm-preempt simulate`` against a measured drill: a Poisson drill on a local cluster, then the
simulator given the figures that drill measured, and how far apart their completion time and node-hours are.

The drill and the prediction are ``slurm_preempt.rehearsal.simdrill`` (the cluster test
``tests/test_simulate_cluster.py`` runs the same code, shorter): one deterministic job
(examples/train_loop.py, one node) computes ``STEPS`` steps while its node is preempted at Poisson
times with mean ``MTBP`` seconds of its running time; the simulator, given the drill's own figures,
runs ``RUNS`` seeded runs; printed: its median and p5-p95 against the measurement, over all runs and
over the runs with as many preemptions as the drill had.

    .venv/bin/python bench/run.py --only simulate [--quick]
    SP_BENCH_PORT=18500 .venv/bin/python bench/bench_simulate.py [--quick] [--slurm 24.11] [--seed N]
    SP_BENCH_PORT=18500 .venv/bin/python bench/bench_simulate.py --rate-jump 100:4   # mtbp 60 s -> 15 s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from slurm_preempt.rehearsal import testcluster, versions
from slurm_preempt.rehearsal.clusterspec import BENCH_PORT
from slurm_preempt.rehearsal.simdrill import AGREEMENT, predicted, run_drill

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_loop.py"
MTBP, RUNS = 60.0, 4000
PORT = int(os.environ.get("SP_BENCH_PORT", str(BENCH_PORT + 40)))


def run(
    quick: bool = False, slurm: str = versions.SYSTEM, seed: int = 11, jump: tuple[float, float] | None = None
) -> list[dict]:
    if os.geteuid() != 0:
        raise RuntimeError("needs root and Slurm (it starts a local cluster)")
    steps = 2400 if quick else 4000
    folder = Path(tempfile.mkdtemp(prefix="sp-bench-simulate-"))
    spec = testcluster.ClusterSpec(
        directory=folder / "cluster", standard=1, preemptible=2, port=PORT, hooks=True, slurm=slurm
    )
    state = testcluster.up(spec)
    try:
        os.environ.update(state.env())
        (folder / "job").mkdir()
        measured = run_drill(state, folder / "job", EXAMPLE, steps, seed, MTBP, jump)
    finally:
        testcluster.down(spec.directory)
    model = predicted(measured, MTBP, jump, RUNS)
    print(json.dumps({"measured": measured, "predicted": model}), file=sys.stderr)
    field = f", rate x{jump[1]:g} from {jump[0]:g} s" if jump else ""
    return _rows(
        measured, model, f"{measured['preemptions']} preemptions, mtbp {MTBP:g} s{field}, Slurm {slurm}"
    )


def _rows(measured: dict, model: dict, drilled: str) -> list[dict]:
    rows = []
    for key, what in (("wall", "completion time"), ("held", "node-hours held")):
        for scope, found in (("all runs", model[key]), ("same preemption count", model[f"{key}_same_count"])):
            if found is None:
                continue
            ratio = measured[key] / found["median"]
            rows.append({
                "name": f"drill ({drilled}) {what} vs simulate, "
                        f"{scope} (p5-p95 {found['p5']:.0f}-{found['p95']:.0f} s)",
                "value": round(measured[key], 1), "unit": "s", "baseline": round(found["median"], 1),
                "ratio": round(ratio, 3), "target": f"within {AGREEMENT:.0%}: {abs(ratio - 1) <= AGREEMENT}",
            })  # fmt: skip
    overhead, found = measured["wall"] - measured["work"], model["overhead_same_count"]
    if found is not None:  # what the model adds to the work: the part it can get wrong
        rows.append({
            "name": f"drill overhead (completion time - work) vs simulate, same preemption count "
                    f"(p5-p95 {found['p5']:.1f}-{found['p95']:.1f} s)",
            "value": round(overhead, 1), "unit": "s", "baseline": round(found["median"], 1),
            "ratio": round(overhead / found["median"], 3) if found["median"] > 0 else None,
            "target": "shows which phases the model misses",
        })  # fmt: skip
    for phase, values in measured["phases"].items():
        if values:
            rows.append({"name": f"drain -> running again: {phase} (median)",
                         "value": round(statistics.median(values), 2), "unit": "s", "baseline": None,
                         "ratio": None, "target": ""})  # fmt: skip
    rows.append({"name": "first running -> computing (added to the prediction)",
                 "value": round(measured["first_start"], 2), "unit": "s", "baseline": None, "ratio": None,
                 "target": ""})  # fmt: skip
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--slurm", default=versions.SYSTEM)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--rate-jump", metavar="SECONDS:FACTOR", help="the rate jumps, as simulate's --rate-jump"
    )
    args = parser.parse_args()
    at, _, factor = (args.rate_jump or "").partition(":")
    for row in run(args.quick, args.slurm, args.seed, (float(at), float(factor)) if args.rate_jump else None):
        print(json.dumps(row))
