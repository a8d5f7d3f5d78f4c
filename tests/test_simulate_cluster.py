"""``slurm-preempt simulate`` against a measured drill on a real local cluster (issue 27, item 5): one
Poisson drill of a few preemptions of a one-node job, the watcher telling it each time, and the
simulator's prediction from the drill's own figures (``slurm_preempt.rehearsal.simdrill``, the code
``bench/bench_simulate.py`` runs longer). The completion time and node time held must agree within
15%: ratios of figures from the same run, which a loaded machine slows alike (the prediction takes
the drill's measured step, checkpoint, notice latency, restart and wait)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterutil import HUNG_AFTER, own_cluster
from slurm_preempt.rehearsal.simdrill import AGREEMENT, predicted, run_drill

pytestmark = pytest.mark.cluster
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_loop.py"
STEPS, MTBP, SEED, RUNS = 2400, 30.0, 5, 4000  # ~120 s of work; seed 5 draws 3 preemptions in it


@pytest.fixture(scope="module")
def scluster():
    with own_cluster("simulate", standard=1, preemptible=2, hooks=True) as handle:
        yield handle


def test_the_simulators_prediction_matches_a_poisson_drill_within_15_percent(scluster):
    work = scluster.workdir / "simulate-drill"
    work.mkdir()
    measured = run_drill(scluster.state, work, EXAMPLE, STEPS, SEED, MTBP, give_up=HUNG_AFTER)
    model = predicted(measured, MTBP, None, RUNS)
    print(json.dumps({"measured": measured, "predicted": model}, indent=1))
    assert measured["preemptions"] >= 1 and measured["told"] == measured["preemptions"], measured
    assert model["runs_same_count"] >= 50, model  # enough simulated runs with the drill's count
    for key in ("wall", "held"):
        simulated = model[f"{key}_same_count"]["median"]
        ratio = measured[key] / simulated
        print(f"{key}: measured {measured[key]:.1f} s, simulated {simulated:.1f} s "
              f"(same count of {measured['preemptions']}), ratio {ratio:.3f}")  # fmt: skip
        assert abs(ratio - 1.0) <= AGREEMENT, (key, ratio)
    overhead = measured["wall"] - measured["work"]
    print(f"overhead (completion - work): measured {overhead:.1f} s, simulated "
          f"{model['overhead_same_count']['median']:.1f} s")  # fmt: skip
