"""slurm_preempt.watch.cost and the watcher's fallback-cost: a job whose completed run costs more on
preemptible nodes than on-demand (the live rate of its pool times its own overhead per preemption, at
the prices or the discount) is moved once, its reason recorded before the scontrol call; the model is
the simulator's; the job's own figures and tokens are checked (fake Slurm, injected clock)."""

from __future__ import annotations

import json
import logging
import math
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import pytest

from fakeslurm import T0
from slurm_preempt import ledger, optin
from slurm_preempt.notice import to_text
from slurm_preempt.records import history, texts
from slurm_preempt.records.prices import Prices
from slurm_preempt.simulate import policies
from slurm_preempt.simulate.spec import Field, JobSpec
from slurm_preempt.simulate.strategies import Strategy
from slurm_preempt.watch import cost
from slurm_preempt.watch.rate import FILE_NAME
from watchworld import OPTED

NOW = T0 + timedelta(seconds=1000)


def ev(kind: str, at: float, **fields) -> dict:
    """An event ``at`` seconds after T0."""
    return {"kind": kind, "time": to_text(T0 + timedelta(seconds=at), "milliseconds"), **fields}


def two_attempts() -> list[dict]:
    """Attempt 0: saves at 100 and 200 s (10 s each), ends at 300 s (100 s lost). Attempt 1 starts at
    400 s, resumes at 430 s (30 s of restart), saves at 500 s (10 s), ends at 700 s (200 s lost)."""
    return [
        ev("attempt_start", 0, restart_count=0, node="pre1"),
        ev("checkpoint_saved", 100, step=10, seconds=10.0),
        ev("checkpoint_saved", 200, step=20, seconds=10.0),
        ev("attempt_end", 300, restart_count=1, node="pre1", nodes="pre1", hook="epilog", exit_code="0:0"),
        ev("attempt_start", 400, restart_count=1, node="pre2"),
        ev("resumed_from", 430, step=20),
        ev("checkpoint_saved", 500, step=30, seconds=10.0),
        ev("attempt_end", 700, restart_count=2, node="pre2", nodes="pre2", hook="epilog", exit_code="0:0"),
    ]


def rates(per_node_hour: float, features=("preemptible",), nodes: int = 4) -> dict:
    pool = ",".join(features)
    return {"pools": {pool: {"features": list(features), "nodes": nodes, "per_node_hour": per_node_hour}}}


def test_the_overhead_is_work_lost_saves_and_restarts_over_the_preemptions():
    found = cost.overhead_of("7", two_attempts(), 2, NOW)
    assert found == cost.Overhead(preemptions=2, lost=300.0, saves=30.0, restarts=30.0)
    assert found.per_preemption == 180.0


def test_no_judgement_on_too_few_facts():
    assert cost.overhead_of("7", two_attempts(), 1, NOW) is None  # one preemption says little
    starts = [e for e in two_attempts() if e["kind"] != "attempt_start"]
    assert cost.overhead_of("7", starts, 2, NOW) is None  # no hooks' starts
    assert cost.overhead_of("7", two_attempts(), 2, T0 + timedelta(seconds=350)) is None  # 2nd: future
    assert cost.pool_rate(None, "preemptible") is None
    assert cost.pool_rate(rates(5.0), "a100") is None  # no pool of that feature
    assert cost.pool_rate(rates(5.0), "preemptible|standard") is None  # names no one pool set


def test_a_forged_or_absurd_save_is_not_counted():
    forged = [
        *two_attempts(),
        ev("checkpoint_saved", 150, step=15, seconds=1e12),
        ev("checkpoint_saved", 160, step=16, seconds=float("nan")),
        ev("checkpoint_saved", 170, step=17, seconds=True),
        ev("checkpoint_saved", 180, step=18, seconds="60"),
        ev("checkpoint_saved", 190, step=19, seconds=-5),
        ev("checkpoint_saved", 5000, step=99, seconds=10.0),  # in the future
    ]
    assert cost.overhead_of("7", forged, 2, NOW).saves == 30.0


def test_the_pools_a_constraint_allows_weighted_by_their_nodes():
    published = {
        "pools": {
            "a100,preemptible": {"features": ["a100", "preemptible"], "nodes": 3, "per_node_hour": 2.0},
            "h100,preemptible": {"features": ["h100", "preemptible"], "nodes": 1, "per_node_hour": 6.0},
            "standard": {"features": ["standard"], "nodes": 2, "per_node_hour": 0.0},
            "bad": {"features": ["preemptible"], "nodes": "many", "per_node_hour": 1e9},
        }
    }
    rate, names = cost.pool_rate(published, "preemptible")
    assert rate == pytest.approx(3.0) and names == "a100,preemptible, h100,preemptible"
    assert cost.pool_rate(published, "a100&preemptible")[0] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("per_node_hour", "margin", "moved"),
    # 180 s per preemption: a share of 1 - r/20 kept; at the 50% discount dearer past r = 10.
    [(5.0, 0, False), (9.9, 0, False), (12.0, 0, True), (12.0, 30, False), (16.0, 30, True), (25.0, 0, True)],
)
def test_dearer_when_the_price_over_the_useful_share_passes_one_plus_the_margin(per_node_hour, margin, moved):
    wish = cost.CostWish("7", preemptions=2, constraint="preemptible", nodes=1, margin=margin)
    why = cost.judge(wish, two_attempts(), rates(per_node_hour), Prices(), NOW)
    assert (why is not None) == moved
    if moved:
        print(why)
        assert "180 s lost per preemption" in why and f"fallback-cost={margin}%" in why
        assert "assumed discount 50%" in why


def test_prices_of_the_jobs_unit_win_over_the_discount():
    prices = Prices(gpu_on_demand=4.0, gpu_preemptible=1.0, cpu_on_demand=1.0, cpu_preemptible=0.9)
    assert cost.price_ratio(prices, gpus=True) == (0.25, "GPU-hour prices")
    assert cost.price_ratio(prices, gpus=False) == (0.9, "CPU-hour prices")
    assert cost.price_ratio(Prices(discount=0.7), gpus=True)[0] == pytest.approx(0.3)
    gpu_events = [dict(e, gpus="0,1") if e["kind"] == "attempt_start" else e for e in two_attempts()]
    wish = cost.CostWish("7", preemptions=2, constraint="preemptible", nodes=1, margin=0)
    # At r = 12 a share of 0.4 is kept: dearer at half price, not at a quarter.
    assert cost.judge(wish, gpu_events, rates(12.0), prices, NOW) is None
    assert cost.judge(wish, two_attempts(), rates(12.0), prices, NOW) is not None


def test_the_simulator_decides_with_the_same_model():
    """One simulated run with the overhead and rate of the job above: the same verdict either side."""
    spec = JobSpec(work_hours=10, nodes=1, checkpoint_seconds=10, restart_seconds=(30, 30), field=Field(1.0))
    strategy = Strategy("toolkit-cost", "cost", 600.0, notices=True, fallback="cost")
    for per_node_hour in (5.0, 12.0):
        state = SimpleNamespace(
            preemptions=np.array([2]), held_spot=np.array([1360.0]), done=np.array([1000.0])
        )
        live = np.array([per_node_hour / 3600.0])
        simulated = bool(policies.decide(spec, strategy, state, np.array([0]), live)[0])
        ratio = cost.cost_ratio(spec.prices.ratio, per_node_hour / 3600.0, 180.0)
        wish = cost.CostWish("7", preemptions=2, constraint="preemptible", nodes=1, margin=0)
        watched = cost.judge(wish, two_attempts(), rates(per_node_hour), Prices(), NOW) is not None
        assert simulated == watched == (ratio > 1.0)
    assert cost.cost_ratio(0.5, 1 / 100.0, 100.0) == math.inf  # every second of it lost: never completes


def test_the_token_is_a_whole_percent_and_anything_else_is_ignored():
    wish = optin.parse(f"{OPTED} slurm-preempt:fallback-cost=10")
    assert wish.fallback_cost == 10 and optin.parse(wish.to_comment()) == wish
    assert optin.parse(f"{OPTED} slurm-preempt:fallback-cost=0").fallback_cost == 0
    for bad in ("-1", "1001", "1e3", "0x10", "²", "10%", "9" * 40, ""):
        comment = f"{OPTED} slurm-preempt:fallback-cost={bad}"
        assert optin.parse(comment).fallback_cost is None
        assert optin.unread_cost(comment) == bad[:64]
    assert optin.unread_cost(f"{OPTED} slurm-preempt:fallback-cost=25") is None
    assert optin.unread_cost(OPTED) is None


def _requeued(world, per_node_hour: float, comment: str) -> None:
    world.slurm.add_job("7", comment=comment, restart_count=2, reason="BeginTime", features="preemptible")
    for event in two_attempts():
        kind, time = event.pop("kind"), event.pop("time")
        source = "job" if kind in ("checkpoint_saved", "resumed_from") else "prolog"
        ledger.record(world.state_dir, "7", kind, source, time=time, **event)
    (world.state_dir / FILE_NAME).write_text(json.dumps(rates(per_node_hour)))
    world.clock.advance(1000)


def test_watcher_moves_a_dearer_job_once_recorded_before_and_history_says_why(world):
    """A user's watcher, reading the rate the cluster daemon published (the daemon writes its own)."""
    _requeued(world, 12.0, f"{OPTED} slurm-preempt:fallback-cost=0")
    watcher = world.watcher(user="root")
    watcher.poll_once()
    watcher.poll_once()
    assert [c for c in world.slurm.called("update_job") if "features" in c] == [
        {"job_id": "7", "features": "standard"}
    ]
    [record] = [e for e in ledger.events(world.state_dir, "7") if e["kind"] == "fallback"]
    assert record["why"].startswith("on preemptible nodes a completed run costs 1.25x on-demand")
    text = texts.history_text(history.from_ledger("7", world.state_dir, None))
    assert "moved to standard: on preemptible nodes a completed run costs 1.25x" in text


def test_watcher_leaves_a_job_cheaper_than_on_demand(world):
    _requeued(world, 5.0, f"{OPTED} slurm-preempt:fallback-cost=0")
    world.watcher(user="root").poll_once()
    assert "fallback" not in world.kinds("7")
    assert not [c for c in world.slurm.called("update_job") if "features" in c]


def test_a_forged_token_is_ignored_with_one_line(world, caplog):
    _requeued(world, 50.0, f"{OPTED} slurm-preempt:fallback-cost=;rm")
    watcher = world.watcher(user="root")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            watcher.poll_once()
    said = [r.getMessage() for r in caplog.records if "fallback-cost" in r.getMessage()]
    assert said == ["job 7: fallback-cost=';rm' ignored (a whole percent, 0-1000)"]
    assert "fallback" not in world.kinds("7")


def test_sbatch_writes_the_token_and_refuses_a_margin_out_of_range():
    from click.testing import CliRunner

    from slurm_preempt.cli import main

    made = CliRunner().invoke(main, ["sbatch", "--fallback-cost", "10", "--", "true"])
    assert made.exit_code == 0 and " slurm-preempt:fallback-cost=10" in made.output, made.output
    for bad in ("1001", "-1", "ten"):
        refused = CliRunner().invoke(main, ["sbatch", "--fallback-cost", bad, "--", "true"])
        assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
        assert refused.output.startswith("Error: --fallback-cost"), refused.output


def test_a_bad_report_section_stops_the_watcher_at_start(tmp_path):
    from slurm_preempt.errors import ConfigError
    from slurm_preempt.watch import settings

    config = tmp_path / "config.toml"
    config.write_text("[report]\npreemptible_discount = 2\n")
    with pytest.raises(ConfigError, match="preemptible_discount"):
        settings.build({}, config_file=config, state_dir=tmp_path, allow_preemptible_host=True)
    config.write_text("[report]\ngpu_hour_on_demand = 4.0\ngpu_hour_preemptible = 1.0\n")
    built = settings.build({}, config_file=config, state_dir=tmp_path, allow_preemptible_host=True)
    assert cost.price_ratio(built.ctx.prices, gpus=True) == (0.25, "GPU-hour prices")
