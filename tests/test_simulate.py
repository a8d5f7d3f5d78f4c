"""slurm_preempt.simulate and ``slurm-preempt simulate``: the model against Daly's closed form, the
strategies and fallback policies, reproducibility, traces and bad input."""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from click.testing import CliRunner

from slurm_preempt.cli import main
from slurm_preempt.errors import UsageError
from slurm_preempt.job.interval import checkpoint_interval, daly
from slurm_preempt.simulate import engine, results, trace
from slurm_preempt.simulate.spec import Field, JobSpec, Policy
from slurm_preempt.simulate.strategies import Strategy, strategies

REFERENCE = dict(work_hours=100, nodes=4, checkpoint_seconds=60, restart_seconds=(180.0, 300.0))


def daly_wall_seconds(work: float, c: float, restart: float, mtbi: float, tau: float) -> float:
    """Daly (2006), eq. 14: expected wall time with Poisson failures, restart R, segments tau + c."""
    return mtbi * math.exp(restart / mtbi) * (math.exp((tau + c) / mtbi) - 1) * work / tau


@pytest.mark.parametrize("c, restart, mtbi_hours", [(60, 240, 0.5), (30, 0, 2.0), (300, 120, 1.0)])
def test_constant_rate_without_notice_matches_dalys_closed_form_within_2_percent(c, restart, mtbi_hours):
    spec = JobSpec(
        work_hours=20,
        nodes=1,
        checkpoint_seconds=c,
        restart_seconds=(restart, restart),
        field=Field(mtbp_hours=mtbi_hours),
    )
    tau = daly(c, mtbi_hours * 3600)
    plain = Strategy("plain", "plain", tau, requeue_wait=0.0)
    runs = engine.simulate(spec, plain, 4000, seed=7)
    # Daly's model restarts after every failure, the first start too: ours starts without one.
    expected = daly_wall_seconds(spec.work_seconds, c, restart, mtbi_hours * 3600, tau) - restart
    measured = float(runs.now.mean())
    print(
        f"c={c} R={restart} M={mtbi_hours}h: simulated {measured / 3600:.2f} h, Daly {expected / 3600:.2f} h"
    )
    assert runs.completed.all()
    assert measured == pytest.approx(expected, rel=0.02)


def test_the_reference_job_plain_recipe_pays_what_daly_says_and_the_toolkit_less():
    spec = JobSpec(**REFERENCE, field=Field(mtbp_hours=2.0))
    found = {s.name: s for s in results.run_all(spec, 2000, seed=1)}
    print({name: round(s.cost_fraction or 0, 3) for name, s in found.items()})
    assert found["on-demand"].cost_fraction == pytest.approx(1.0)
    assert 0.72 <= (found["plain"].cost_fraction or 0) <= 0.77  # Daly, restart 3-5 min: 0.72-0.77
    assert (found["toolkit"].cost_fraction or 1) < (found["plain"].cost_fraction or 0) - 0.1
    assert found["toolkit"].median_hours < found["plain"].median_hours  # type: ignore[operator]


def test_same_seed_same_figures_other_seed_other_figures():
    spec = JobSpec(work_hours=5, nodes=2, checkpoint_seconds=30, restart_seconds=(60, 120))
    first, again = (results.run_all(spec, 300, seed=3) for _ in range(2))
    other = results.run_all(spec, 300, seed=4)
    assert first == again
    assert [s.median_hours for s in first] != [s.median_hours for s in other]


def _toolkit(spec: JobSpec, fallback: str | None, count: int = 1500) -> results.Summary:
    strategy = next(s for s in strategies(spec) if s.notices and s.fallback == fallback)
    return results.summarise(spec, strategy, engine.simulate(spec, strategy, count, seed=2))


def test_deadline_policy_never_moves_with_a_loose_deadline_and_saves_a_tight_one():
    loose = JobSpec(**REFERENCE, deadline_hours=200)
    assert _toolkit(loose, "deadline").moved_share == 0
    tight = JobSpec(**REFERENCE, deadline_hours=118)
    alone, policed = _toolkit(tight, None), _toolkit(tight, "deadline")
    print(f"deadline 118 h: miss {alone.miss_probability:.1%} alone, {policed.miss_probability:.1%} policed")
    assert (alone.miss_probability or 0) > 0.5
    assert policed.miss_probability == 0 and policed.moved_share > 0.9


def test_cost_policy_moves_once_a_rate_jump_makes_preemptible_dearer():
    calm = JobSpec(work_hours=20, nodes=4, checkpoint_seconds=60, restart_seconds=(180, 300))
    jump = JobSpec(
        work_hours=20,
        nodes=4,
        checkpoint_seconds=60,
        restart_seconds=(180, 300),
        field=Field(mtbp_hours=2.0, jump_hour=2.0, jump_factor=20.0),
    )
    assert _toolkit(calm, "cost").moved_share < 0.05
    moved = _toolkit(jump, "cost")
    assert moved.moved_share > 0.9
    assert (moved.cost_fraction or 2) < (_toolkit(jump, None).cost_fraction or 0)


def test_fallback_after_moves_at_the_kth_preemption_and_stays_moved():
    spec = JobSpec(**REFERENCE, policy=Policy(fallback_after=2))
    runs = _toolkit(spec, "after", 500)
    assert runs.mean_preemptions == pytest.approx(2.0)
    assert runs.moved_share == 1.0


def test_pending_policy_moves_only_runs_that_wait_longer_than_its_limit():
    spec = JobSpec(
        work_hours=20,
        nodes=4,
        checkpoint_seconds=60,
        restart_seconds=(180, 300),
        field=Field(mtbp_hours=8.0, mass_drain_hours=5.0, capacity_wait_minutes=60),
    )
    pending, alone = _toolkit(spec, "pending", 500), _toolkit(spec, None, 500)
    assert pending.moved_share > 0.5 and alone.moved_share == 0
    assert (pending.median_hours or 0) < (alone.median_hours or 0)


def test_a_trace_is_resampled_per_node(tmp_path):
    path = tmp_path / "trace.txt"
    lines = ["# a comment", "2026-12-01T00:00:00Z pre1", "2026-12-01T02:00:00Z pre1", "7200 pre2"]
    lines += ["2026-12-01T04:00:00 pre1", "14400 pre2", "21600 pre2"]
    path.write_text("\n".join(lines) + "\n")
    gaps = trace.read_gaps(path)
    assert sorted(gaps) == [7200.0] * 4
    spec = JobSpec(**REFERENCE, field=Field(trace_gaps=gaps))
    by_trace = _toolkit(spec, None, 500)
    assert by_trace.mean_preemptions > 100  # 4 nodes, a preemption every 2 h each: ~one per 30 min


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe\x00", "not text"),
        (b"yesterday\n", "is not a time"),
        (b"10\n", "need at least 2"),
        (b"10\n10\n20\n", "same time"),
        (b"1 2 3\n", r"expected TIME \[NODE\]"),
    ],
)
def test_a_file_that_is_not_a_trace_is_one_usage_error(tmp_path, content, message):
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        trace.read_gaps(path)


ARGS = [
    "simulate",
    "--work-hours",
    "10",
    "--nodes",
    "2",
    "--mtbp",
    "2",
    "--checkpoint-seconds",
    "60",
    "--restart-seconds",
    "60-120",
    "--runs",
    "500",
]


def test_cli_prints_the_table_json_and_an_svg(tmp_path):
    runner = CliRunner()
    table = runner.invoke(main, [*ARGS, "--deadline-hours", "14"])
    assert table.exit_code == 0, table.output
    for label in ("on-demand only", "seeds' plain recipe", "submitit-style", "fallback-deadline", "P(miss)"):
        assert label in table.output
    svg = tmp_path / "cost.svg"
    as_json = runner.invoke(main, [*ARGS, "--json", "--svg", str(svg)])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["runs"] == 500 and data["strategies"][0]["cost_fraction"] == pytest.approx(1.0)
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg") and len(root.findall("{http://www.w3.org/2000/svg}polyline")) >= 7


@pytest.mark.parametrize(
    "extra",
    [
        ["--work-hours", "-3"],
        ["--work-hours", "nan"],
        ["--checkpoint-seconds", "inf"],
        ["--work-hours", "1e12"],
        ["--nodes", "2.5"],
        ["--deadline-hours", "-1"],
        ["--restart-seconds", "300-60"],
        ["--mtbp", "0"],
        ["--rate-jump", "5"],
        ["--discount", "1.5"],
        ["--runs", "-4"],
        ["--trace", "/nonexistent/trace"],
        ["--min-nodes", "5"],
        ["--min-nodes", "0"],
        ["--min-nodes", "nan"],
        ["--min-nodes", "1.5"],
        ["--shrink-restart-seconds", "-1"],
        ["--grow-back"],
        ["--grow-back", "--min-nodes", "2"],
        ["--min-nodes", "1", "--grow-back", "--refill-minutes", "-5"],
        ["--min-nodes", "1", "--grow-back", "--refill-minutes", "60-10"],
        ["--min-nodes", "1", "--grow-back", "--refill-minutes", "nan"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra):
    result = CliRunner().invoke(main, [*ARGS, *extra])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("Error: ")


def test_ten_thousand_runs_take_seconds():
    spec = JobSpec(**REFERENCE, field=Field(mtbp_hours=2.0))
    started = time.perf_counter()
    engine.simulate(spec, strategies(spec)[1], 10_000, seed=1)
    print(f"10,000 runs of the reference job, plain recipe: {time.perf_counter() - started:.2f} s")


# ------------------------------------------------------------------------------ the shrink in place


def _shrink_spec(**changes) -> JobSpec:
    return JobSpec(**{**REFERENCE, "field": Field(mtbp_hours=2.0), **changes})


def test_min_nodes_equal_to_nodes_leaves_every_figure_exactly_as_without_it():
    without = results.run_all(_shrink_spec(), 1000, seed=1)
    assert results.run_all(_shrink_spec(min_nodes=4), 1000, seed=1) == without
    assert all(s.mean_shrinks == 0 for s in without)
    table = results.table(_shrink_spec(min_nodes=4), without, 1000, 1)
    assert table == results.table(_shrink_spec(), without, 1000, 1) and "shrunk" not in table


def test_shrink_rows_come_after_the_others_which_keep_their_figures():
    without = results.run_all(_shrink_spec(), 1000, seed=1)
    shrinking = results.run_all(_shrink_spec(min_nodes=2), 1000, seed=1)
    assert shrinking[:-1] == without
    row = shrinking[-1]
    print(f"reference job, shrink to 2: {row.cost_fraction:.3f} of on-demand, {row.mean_shrinks:.1f} shrinks")
    assert row.label == "slurm-preempt, shrink to 2" and row.mean_shrinks > 0
    toolkit = next(s for s in without if s.name == "toolkit")
    # Fewer requeues, each a 3-5 min restart on all nodes, for a 19 s restart on the survivors ...
    assert (row.cost_fraction or 1) < (toolkit.cost_fraction or 0)
    assert row.held_shares["restarts"] < toolkit.held_shares["restarts"]
    # ... and, without grow-back, slower: the job computes on fewer nodes until it is requeued.
    assert row.median_hours > toolkit.median_hours  # type: ignore[operator]


def test_only_a_told_preemption_of_a_node_other_than_the_batch_host_shrinks():
    """Two nodes, shrink to one: each attempt's first told preemption takes the batch host one time in
    two (requeue), else the job goes on alone, and the next preemption (at the minimum) requeues."""
    spec = _shrink_spec(nodes=2, min_nodes=1, field=Field(mtbp_hours=2.0, unannounced=0.0))
    shrink = strategies(spec)[-1]
    runs = engine.simulate(spec, shrink, 3000, seed=5)
    shrinks, requeues = runs.shrinks.sum(), (runs.preemptions - runs.shrinks).sum()
    print(f"{shrinks} shrinks for {requeues} requeues")
    assert shrinks / requeues == pytest.approx(0.5, rel=0.05)
    unannounced = _shrink_spec(nodes=2, min_nodes=1, field=Field(mtbp_hours=2.0, unannounced=1.0))
    assert engine.simulate(unannounced, shrink, 300, seed=5).shrinks.sum() == 0
    mass_only = _shrink_spec(min_nodes=2, field=Field(mtbp_hours=1e5, mass_drain_hours=2.0))
    runs = engine.simulate(mass_only, strategies(mass_only)[-1], 300, seed=5)
    # A mass drain requeues; the rare single preemption (one node in 10^5 h) may still shrink.
    assert runs.preemptions.sum() > 1000 and runs.shrinks.sum() < runs.preemptions.sum() / 1000


def test_a_free_shrink_costs_the_same_node_hours_for_the_same_work():
    """Linear scaling: on 3 of 4 nodes the job computes at 3/4 of its speed and pays 3 nodes, so with
    free restarts and checkpoints the shrinking job pays what the requeueing one pays, and takes longer."""
    free = _shrink_spec(
        min_nodes=2,
        checkpoint_seconds=0.0,
        restart_seconds=(0.0, 0.0),
        shrink_restart_seconds=0.0,
        field=Field(mtbp_hours=2.0, unannounced=0.0),
    )
    found = {s.name: s for s in results.run_all(free, 500, seed=3)}
    shrink, toolkit = found["toolkit-shrink"], found["toolkit"]
    assert shrink.mean_shrinks > 10
    assert shrink.held_shares["restarts"] == 0 and shrink.held_shares["lost"] == pytest.approx(0, abs=1e-9)
    # The job computes until told, and its final checkpoint keeps that work: nothing separates them.
    assert shrink.cost_fraction == pytest.approx(toolkit.cost_fraction, rel=1e-9)
    assert shrink.median_hours > toolkit.median_hours * 1.2  # type: ignore[operator]


def test_cli_shrink_rows_in_the_table_json_and_svg(tmp_path):
    svg = tmp_path / "cost.svg"
    result = CliRunner().invoke(main, [*ARGS, "--min-nodes", "1", "--json", "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["job"]["min_nodes"] == 1 and data["measured"]["shrink_restart_seconds_default"] > 0
    last = data["strategies"][-1]
    assert last["name"] == "toolkit-shrink" and set(last["held_shares"]) == {
        "work",
        "checkpoints",
        "restarts",
        "lost",
    }
    assert "slurm-preempt, shrink to 1" in svg.read_text()
    table = CliRunner().invoke(main, [*ARGS, "--min-nodes", "1"])
    assert "shrunk" in table.output and "shrinks in place to 1" in table.output


# ------------------------------------------------------------------- notices, intervals, grow-back


def test_a_told_job_computes_until_told_so_free_checkpoints_and_restarts_hold_only_the_work():
    """The notice latency is no held time on top of the work: the job computes until it is told, and
    its final checkpoint keeps that work. With free checkpoints and restarts, held == work."""
    free = _shrink_spec(
        nodes=1,
        checkpoint_seconds=0.0,
        restart_seconds=(0.0, 0.0),
        notice_latency_seconds=30.0,
        field=Field(mtbp_hours=0.5, unannounced=0.0),
    )
    toolkit = next(s for s in strategies(free) if s.name == "toolkit")
    runs = engine.simulate(free, toolkit, 500, seed=2)
    assert runs.preemptions.sum() > 500 * 100
    assert runs.completed.all() and (runs.done == free.work_seconds).all()
    assert runs.held_spot == pytest.approx(runs.done, rel=1e-12)


def test_a_notice_too_short_for_latency_and_checkpoint_tells_nothing():
    late = _shrink_spec(min_nodes=2, notice_seconds=60.0, notice_latency_seconds=1.0)  # 1 + 60 > 60 s
    found = strategies(late)
    assert found[3].name == "toolkit" and found[3].interval == found[1].interval  # none announced
    runs = engine.simulate(late, found[-1], 100, seed=1)
    assert runs.preemptions.sum() > 100 and runs.shrinks.sum() == 0


def test_after_a_shrink_the_interval_is_taken_again_on_the_survivors_by_the_one_formula():
    spec = _shrink_spec(min_nodes=2)
    shrink = strategies(spec)[-1]
    intervals = engine._interval(spec, shrink, np.array([4, 3, 2]))
    mtbp = spec.field.mean_gap_seconds
    expected = [checkpoint_interval(60.0, mtbp / n, spec.field.unannounced) for n in (4, 3, 2)]
    assert list(intervals) == pytest.approx(expected) and intervals[0] < intervals[1] < intervals[2]
    assert intervals[0] == shrink.interval  # the full job's, as without a shrink
    plain = strategies(spec)[1]  # the plain recipe never adapts (and never shrinks)
    assert set(engine._interval(spec, plain, np.array([4, 2]))) == {plain.interval}


def _grow_spec(**changes) -> JobSpec:
    return _shrink_spec(min_nodes=2, grow_back=True, **changes)


def test_grow_back_requeues_shrunk_runs_at_full_width_faster_and_dearer():
    """Linear scaling: a shrunk job pays nothing more per unit of work, so growing back buys time with
    one final checkpoint and one restart of the whole job each time."""
    found = results.run_all(_grow_spec(refill_minutes=(10.0, 30.0)), 1000, seed=1)
    assert [s.name for s in found[-2:]] == ["toolkit-shrink", "toolkit-grow"]
    assert found[:-1] == results.run_all(_shrink_spec(min_nodes=2), 1000, seed=1)
    shrink, grow = found[-2:]
    print(
        f"shrink to 2: {shrink.cost_fraction:.3f} in {shrink.median_hours:.1f} h; with grow-back "
        f"{grow.cost_fraction:.3f} in {grow.median_hours:.1f} h, {grow.mean_grows:.1f} grows"
    )
    assert grow.mean_grows > 10 and shrink.mean_grows == 0
    assert grow.median_hours < shrink.median_hours  # type: ignore[operator]
    assert grow.held_shares["restarts"] > shrink.held_shares["restarts"]
    assert grow.held_shares["lost"] < 0.03  # grow-backs lose nothing: only unannounced ones do


def test_grow_back_costs_a_checkpoint_and_a_restart_and_loses_no_work():
    free = _grow_spec(
        checkpoint_seconds=0.0,
        restart_seconds=(0.0, 0.0),
        shrink_restart_seconds=0.0,
        field=Field(mtbp_hours=2.0, unannounced=0.0),
    )
    found = {s.name: s for s in results.run_all(free, 500, seed=3)}
    grow, toolkit = found["toolkit-grow"], found["toolkit"]
    assert grow.mean_grows > 10 and grow.held_shares["lost"] == pytest.approx(0, abs=1e-9)
    assert grow.cost_fraction == pytest.approx(toolkit.cost_fraction, rel=1e-9)


def test_grow_back_waits_for_the_capacity_and_never_grows_an_unshrunk_job():
    never = _grow_spec(refill_minutes=(1e6, 1e6))
    grow = strategies(never)[-1]
    runs = engine.simulate(never, grow, 300, seed=4)
    assert runs.shrinks.sum() > 0 and runs.grows.sum() == 0
    unannounced = _grow_spec(field=Field(mtbp_hours=2.0, unannounced=1.0))
    runs = engine.simulate(unannounced, strategies(unannounced)[-1], 200, seed=4)
    assert runs.shrinks.sum() == 0 and runs.grows.sum() == 0


def test_cli_grow_back_row_and_column(tmp_path):
    result = CliRunner().invoke(main, [*ARGS, "--min-nodes", "1", "--grow-back", "--refill-minutes", "5-20"])
    assert result.exit_code == 0, result.output
    assert "shrink to 1, grow-back" in result.output and "grown" in result.output
    assert "grows back 5-20 min after a removal" in result.output
    data = json.loads(CliRunner().invoke(main, [*ARGS, "--min-nodes", "1", "--grow-back", "--json"]).output)
    assert data["job"]["grow_back"] is True and data["strategies"][-1]["name"] == "toolkit-grow"
