"""Cost report: totals from attempts, prices from config, verdicts and interval advice."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_preempt import ledger
from slurm_preempt.cli import main
from slurm_preempt.errors import ConfigError
from slurm_preempt.records import history, report, texts
from test_history import end, ev, start, three_attempts


def test_prices_from_config_default_to_half_price():
    prices = report.Prices.from_config({"gpu_hour_on_demand": 2.0})
    assert (prices.gpu_on_demand, prices.gpu_preemptible) == (2.0, 1.0)
    explicit = report.Prices.from_config({"gpu_hour_on_demand": 2.0, "gpu_hour_preemptible": 0.7})
    assert explicit.gpu_preemptible == 0.7
    with pytest.raises(ConfigError):
        report.Prices.from_config({"preemptible_discount": 5})
    with pytest.raises(ConfigError):
        report.Prices.from_config({"gpu_hour_on_demand": "cheap"})


def test_job_cost_counts_every_attempt_and_compares_with_on_demand():
    found = history.build("5", three_attempts())
    cost = report.job_cost(found, report.Prices.from_config({"gpu_hour_on_demand": 3.0}))
    assert cost.unit == "GPU-hours" and cost.attempts == 3 and cost.preemptions == 2 and cost.completed
    # 2 GPUs: runs of 100 s, 30 s and 100.5 s; lost 60 s and 10 s.
    assert cost.run_hours == pytest.approx(2 * 230.5 / 3600)
    assert cost.lost_hours == pytest.approx(2 * 70 / 3600)
    assert cost.cost_preemptible == pytest.approx(cost.run_hours * 1.5)
    assert cost.cost_on_demand == pytest.approx((cost.run_hours - cost.lost_hours) * 3.0)
    assert cost.waited_seconds == 30 + 140
    assert cost.verdict.startswith("worth it")


def test_verdict_says_when_preemptible_is_not_worth_it():
    events = [
        start(0, 0, "p1"),
        end(100, 0),
        start(110, 1, "p2"),
        end(200, 1),
        start(210, 2, "p3"),
        end(220, 2),
    ]
    events += [end(220, 2, hook="epilog", node="p3")]
    found = history.build("5", events)
    cost = report.job_cost(
        found, report.Prices.from_config({"gpu_hour_on_demand": 1.0, "preemptible_discount": 0.1})
    )
    assert "NOT worth it" in cost.verdict


def test_advise_interval_uses_young_daly():
    advice = report.advise_interval(checkpoint_seconds=2.0, mtbp_seconds=400.0)
    assert advice["young_seconds"] == pytest.approx((2 * 2.0 * 400.0) ** 0.5, rel=1e-3)
    assert advice["advised_seconds"] > 0
    assert report.advise_interval(None, 400.0) is None and report.advise_interval(2.0, None) is None
    found = history.build("5", three_attempts())
    cost = report.job_cost(found, report.Prices())
    assert cost.interval_advice["checkpoint_seconds"] == 3.0  # mean of the two checkpoint costs


def _ledger_from(tmp_path, job_id, events):
    for event in events:
        fields = {k: v for k, v in event.items() if k not in ("kind", "job_id", "time", "_order")}
        path = ledger.record(tmp_path, job_id, event["kind"], source="test", **fields)
        text = path.read_text().replace(path.read_text().split('"time": "')[1].split('"')[0], event["time"])
        named = path.with_name(f"{event['_order']}-h-1-{event['kind']}.json")
        named.write_text(text)
        path.unlink()


def test_report_command_from_the_ledger(tmp_path, monkeypatch):
    _ledger_from(tmp_path, "5", three_attempts())
    _ledger_from(
        tmp_path,
        "6",
        [
            ev("attempt_start", 0, restart_count=0, node="n", user="bob", partition="gpu"),
            ev("attempt_end", 50, restart_count=0, exit_code="0:0", hook="epilog", node="n"),
        ],
    )
    config = tmp_path / "config.toml"
    config.write_text("[report]\ncpu_hour_on_demand = 1.0\ngpu_hour_on_demand = 4.0\n")
    monkeypatch.setenv("SLURM_PREEMPT_CONFIG", str(config))
    runner = CliRunner()
    both = runner.invoke(main, ["report", "--state-dir", str(tmp_path), "--no-sacct", "--json"])
    assert both.exit_code == 0, both.output
    import json

    data = json.loads(both.output)
    assert data["total"]["jobs"] == 2 and data["total"]["preemptions"] == 2 and data["total"]["attempts"] == 4
    alice = runner.invoke(main, ["report", "--state-dir", str(tmp_path), "--no-sacct", "--user", "alice"])
    assert "1 job(s)" in alice.output and "worth it" in alice.output
    bad = runner.invoke(main, ["report", "--state-dir", str(tmp_path), "--since", "yesterday"])
    assert bad.exit_code == 2 and "not a date" in bad.output and "Traceback" not in bad.output
    hist = runner.invoke(main, ["history", "5", "--state-dir", str(tmp_path), "--no-sacct"])
    assert hist.exit_code == 0 and "attempt 2  pre3" in hist.output
    missing = runner.invoke(main, ["history", "77", "--state-dir", str(tmp_path), "--no-sacct"])
    assert missing.exit_code == 2 and "no attempt of job 77" in missing.output


def test_totals_give_figures_for_sbatch_auto_interval_and_failed_verdict():
    failed = history.build(
        "7", [start(0, 0, "n1"), end(30, 0, code="2:0", hook="epilog", node="n1"), end(30, 0, code="2:0")]
    )
    done = history.build("5", three_attempts())
    result = report.Report(jobs=[report.job_cost(h, report.Prices()) for h in (done, failed)])
    totals = result.totals()
    assert totals["mtbp_seconds"] == pytest.approx((100 + 30 + 100.5 + 30) / 2, abs=0.1)
    assert totals["checkpoint_seconds"] == 3.0
    assert result.jobs[1].verdict == "did not complete: failed (exit 2)"
    assert "sbatch --checkpoint-interval auto" in texts.report_text(result)


def test_without_prices_the_cost_is_compared_in_node_hours_at_the_assumed_discount(data_dir):
    """First use, no [report] prices: the demo job still gets a cost, a ratio and a verdict that
    say they rest on the documented default discount."""
    result = report.build_report(data_dir / "ledger-self-requeue", report.Prices.from_config({}))
    job = result.jobs[0]
    assert job.cost_preemptible is None and job.cost_on_demand is None  # no money without prices
    assert job.assumed_discount == 0.5
    assert job.node_hours == pytest.approx(job.run_hours)  # one node, one CPU
    assert job.cost_fraction == pytest.approx(0.5)  # nothing lost: half the on-demand cost
    assert job.verdict.endswith("50% of the on-demand cost (assumed: preemptible at 50% of on-demand)")
    text = texts.report_text(result)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("28056304"))
    assert row.split()[-3:] == [f"{job.node_hours / 2:.3f}*", f"{job.node_hours:.3f}*", "50%*"]
    assert "* assumed, no price configured: node-hours, preemptible at 50% of the on-demand price" in text
    data = result.to_json()
    assert data["jobs"][0]["cost_fraction"] == 0.5 and data["total"]["assumed_discount"] == 0.5


def test_assumed_cost_counts_nodes_and_says_when_it_is_not_worth_it():
    two_nodes = [start(0, 0, "p1"), start(0, 0, "p2"), end(100, 0), start(110, 1, "p3"), end(200, 1)]
    two_nodes += [start(210, 2, "p1"), end(220, 2), end(220, 2, hook="epilog", node="p1")]
    cost = report.job_cost(history.build("5", two_nodes), report.Prices.from_config({}))
    assert cost.node_hours == pytest.approx((2 * 100 + 90 + 10) / 3600)
    assert cost.lost_node_hours == pytest.approx((2 * 100 + 90) / 3600)  # no checkpoint: all lost
    assert cost.cost_fraction == pytest.approx(0.5 * 300 / 10)
    assert cost.verdict == (
        "preemptible is NOT worth it for this job: lost work and restarts cost 1500% of the on-demand "
        "cost (assumed: preemptible at 50% of on-demand)"
    )
    configured = report.job_cost(
        history.build("5", two_nodes), report.Prices.from_config({"preemptible_discount": 0.9})
    )
    assert configured.cost_fraction == pytest.approx(0.1 * 300 / 10)


def test_prices_win_over_the_assumption():
    found = history.build("5", three_attempts())
    cost = report.job_cost(found, report.Prices.from_config({"gpu_hour_on_demand": 3.0}))
    assert cost.assumed_discount is None
    assert cost.cost_fraction == pytest.approx(cost.cost_preemptible / cost.cost_on_demand)
    text = texts.report_text(report.Report(jobs=[cost]))
    assert "*" not in text and "assumed" not in text


def test_total_ratio_is_taken_before_rounding():
    jobs = [report.JobCost("1", "u", "p", 1, 0, "CPU-hours", 0.0448, 0.0194, 0.0, True)]
    jobs[0].cost_preemptible, jobs[0].cost_on_demand = 0.0448 * 0.02, (0.0448 - 0.0194) * 0.04
    totals = report.Report(jobs=jobs).totals()
    assert totals["cost_fraction"] == pytest.approx(0.8819, abs=1e-4)  # not 0.0009 / 0.001 = 0.9
    assert totals["cost_preemptible"] == 0.0009 and totals["cost_on_demand"] == 0.001


def test_one_unreadable_ledger_is_skipped_and_counted_never_the_report(tmp_path):
    """Finding 9: one job's hostile ledger (its folder is its user's) broke `report` for everyone."""
    from slurm_preempt.records.prices import Prices
    from slurm_preempt.records.report import build_report
    from slurm_preempt.records.texts import report_text

    _ledger_from(tmp_path, "5", three_attempts())
    _ledger_from(tmp_path, "6", three_attempts())
    folder = tmp_path / "jobs" / "6"
    for path in folder.iterdir():
        event = json.loads(path.read_text())
        if event["kind"] == "attempt_start":
            event["nodes"], event["restart_count"], event["cpus_per_node"] = "n[1-99999999]", "9" * 5000, [1]
            path.write_text(json.dumps(event))
    report = build_report(tmp_path, Prices())
    assert [j.job_id for j in report.jobs] == ["5", "6"] or list(report.unreadable) == ["6"]
    assert report_text(report)  # renders whatever was skipped


def test_a_job_whose_history_raises_is_skipped_and_named(tmp_path, monkeypatch):
    from slurm_preempt.records import report as reportmod
    from slurm_preempt.records.prices import Prices

    _ledger_from(tmp_path, "5", three_attempts())
    _ledger_from(tmp_path, "6", three_attempts())
    real = reportmod.hist.from_ledger

    def from_ledger(job_id, state_dir, acct=None):
        if job_id == "6":
            raise ValueError("hostile")
        return real(job_id, state_dir, acct)

    monkeypatch.setattr(reportmod.hist, "from_ledger", from_ledger)
    report = reportmod.build_report(tmp_path, Prices())
    assert [j.job_id for j in report.jobs] == ["5"] and report.unreadable == {"6": "ValueError: hostile"}
    assert "1 job(s) skipped" in texts.report_text(report)
    assert report.to_json()["unreadable"] == {"6": "ValueError: hostile"}


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to make files of another owner")
def test_report_says_which_events_the_jobs_owner_wrote(tmp_path):
    """Issue 28: a job's figures that rest on its owner's word (their events) say so, in text and JSON."""
    import os

    from hostileusers import MALLORY, ensure_user
    from slurm_preempt import ledger

    mallory, _ = ensure_user(MALLORY)
    ledger.record(
        tmp_path, "41", "attempt_start", source="hook", restart_count=0, nodes="pre1", cpus_per_node="1"
    )
    os.chown(ledger.job_dir(tmp_path, "41"), mallory, mallory)
    saved = ledger.record(tmp_path, "41", "checkpoint_saved", source="job", step=1)
    os.chown(saved, mallory, mallory)
    built = report.build_report(tmp_path, report.Prices.from_config({}))
    assert built.jobs[0].to_json()["events_by"] == {"root": 1, "owner": 1}
    assert "1 of its events written by the job's owner, not root" in texts.report_text(built)


def test_report_prints_the_live_preemption_rate_with_its_window_and_count(tmp_path, monkeypatch):
    from datetime import timedelta

    from fakeslurm import T0
    from slurm_preempt.watch.rate import RateTracker

    (tmp_path / "empty.toml").write_text("")
    monkeypatch.setenv("SLURM_PREEMPT_CONFIG", str(tmp_path / "empty.toml"))
    tracker = RateTracker(6 * 3600, 900, T0)
    tracker.set_pools({"preemptible": 4})
    for hour in (1, 2, 3):
        tracker.saw(f"pre{hour}", "preemptible", T0 + timedelta(hours=hour), T0 + timedelta(hours=4))
    tracker.publish(tmp_path, T0 + timedelta(hours=4))
    runner = CliRunner()
    text = runner.invoke(main, ["report", "--state-dir", str(tmp_path), "--no-sacct"])
    assert text.exit_code == 0, text.output
    assert (
        "preemptible: 0.188 per node-hour, a node every 5.3 h: 3 preemption(s) of 4 node(s) in the "
        "last 4.00 h" in text.output
    )
    as_json = json.loads(
        runner.invoke(main, ["report", "--state-dir", str(tmp_path), "--no-sacct", "--json"]).output
    )
    assert as_json["live_rate"]["pools"]["preemptible"]["preemptions"] == 3
