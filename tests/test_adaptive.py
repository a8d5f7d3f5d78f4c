"""slurm_preempt.job.adaptive and ``Run(interval="auto")``: Daly's interval from the job's measured saves
and the live preemption rate the watcher publishes, taken again at every save, recorded for history."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fakeslurm import T0
from slurm_preempt import ledger
from slurm_preempt.job.adaptive import DEFAULT_SECONDS, ENV_POOL, AdaptiveInterval, preemption_history
from slurm_preempt.job.environment import ENV_CHECKPOINT_INTERVAL
from slurm_preempt.job.interval import checkpoint_interval, daly
from slurm_preempt.job.resume import Run, Wiring
from slurm_preempt.records import history, texts
from slurm_preempt.watch.rate import RateTracker

HOUR = 3600.0


def publish(state_dir, per_node_hour: float, nodes: int = 10, pool: str = "preemptible") -> None:
    """The watcher's file, as it writes it, for a pool preempted at ``per_node_hour`` over 6 h."""
    tracker = RateTracker(6 * HOUR, 900, T0)
    tracker.set_pools({pool: nodes, "standard": 2})
    count = round(per_node_hour * nodes * 6)
    now = T0 + timedelta(hours=6)
    for i in range(count):
        tracker.saw(f"n{i}", pool, T0 + timedelta(seconds=(i + 0.5) * 6 * HOUR / count), now)
    state_dir.mkdir(parents=True, exist_ok=True)
    tracker.publish(state_dir, now)


def test_without_a_rate_the_stated_default_never_below_one_checkpoint(tmp_path):
    adaptive = AdaptiveInterval(tmp_path, 4, {})
    assert adaptive.update() == DEFAULT_SECONDS
    assert AdaptiveInterval(None, 4, {ENV_CHECKPOINT_INTERVAL: "600"}).saved(30) == 600
    assert (
        AdaptiveInterval(None, 4, {ENV_CHECKPOINT_INTERVAL: "600"}).saved(900) == 900
    )  # a save longer than it


def test_dalys_interval_from_the_measured_cost_and_the_jobs_share_of_the_live_rate(tmp_path):
    publish(tmp_path, 0.5)  # a node every 2 h: a 4-node job every 30 min
    adaptive = AdaptiveInterval(tmp_path, 4, {})
    assert adaptive.saved(60) == pytest.approx(daly(60, 1800), rel=1e-3)
    assert adaptive.basis == {
        "basis": "live rate",
        "checkpoint_seconds": 60,
        "mtbp_seconds": 1800.0,
        "unannounced_share": 1.0,  # no history: every preemption taken as unannounced
    }
    assert adaptive.saved(80) == pytest.approx(daly(70, 1800), rel=1e-3)  # the median of its saves


def test_a_job_told_of_its_preemptions_in_time_checkpoints_less_often(tmp_path):
    """Three restarts, each after a final checkpoint: a quarter of preemptions taken as unannounced, the
    interval is Daly's against those (the rule ``simulate`` models), longer than against all."""
    publish(tmp_path, 0.5)
    for step in (10, 20, 30):
        ledger.record(tmp_path, "7", "checkpoint_saved", "job", step=step, final=True)
    ledger.record(tmp_path, "7", "checkpoint_saved", "job", step=35, final=False)
    assert preemption_history(tmp_path, "7", restart_count=3) == (3, 3)
    told = AdaptiveInterval(tmp_path, 4, {}, history=(3, 3))
    assert told.saved(60) == pytest.approx(checkpoint_interval(60, 1800, 0.25), rel=1e-3)
    assert told.saved(60) == pytest.approx(daly(60, 4 * 1800), rel=1e-3) and told.seconds > daly(60, 1800)
    assert told.basis["unannounced_share"] == 0.25
    lost = AdaptiveInterval(tmp_path, 4, {}, history=preemption_history(tmp_path, "8", restart_count=3))
    assert lost.saved(60) == pytest.approx(daly(60, 1800), rel=1e-3)  # no final checkpoint: no notices


def test_an_unreadable_ledger_counts_the_restarts_alone(tmp_path):
    (tmp_path / "jobs").write_text("not a folder")
    assert preemption_history(tmp_path, "7", restart_count=2) == (2, 0)
    assert preemption_history(None, "7", restart_count=-1) == (0, 0)


def test_a_named_pool_is_read_alone_else_the_highest_rate(tmp_path):
    publish(tmp_path, 0.5)
    assert AdaptiveInterval(tmp_path, 1, {ENV_POOL: "standard"}).saved(60) == DEFAULT_SECONDS  # rate 0
    assert AdaptiveInterval(tmp_path, 1, {}).saved(60) == pytest.approx(daly(60, 7200), rel=1e-3)


def test_a_bad_rate_file_leaves_the_default(tmp_path):
    (tmp_path / "preemption-rate.json").write_text('{"pools": {"p": {"per_node_hour": "NaN"}, "q": 7}}')
    assert AdaptiveInterval(tmp_path, 4, {}).saved(60) == DEFAULT_SECONDS


def test_run_auto_shortens_its_interval_at_the_save_after_a_jump_and_history_shows_both(tmp_path):
    state = tmp_path / "state"
    (tmp_path / "config.toml").write_text("")
    env = {
        "SLURM_JOB_ID": "123",
        "SLURM_PREEMPT_STATE_DIR": str(state),
        "SLURM_PREEMPT_CONFIG": str(tmp_path / "config.toml"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "SLURM_JOB_NUM_NODES": "4",
    }
    ledger.record(state, "123", "attempt_start", "prolog", restart_count=0, node="pre1")
    publish(state, 0.05)
    with Run(tmp_path / "ckpt", interval="auto", _wiring=Wiring(environ=env, log_to_stderr=True)) as run:
        assert run.interval == 1800  # the stated default until a save is measured
        run.save(1, {"w": list(range(1000))})
        calm = run.interval
        publish(state, 5.0)  # the watcher saw the pool jump a hundredfold
        run.save(2, {"w": list(range(1000))})
        print(f"interval before the jump {calm:.3f} s, after {run.interval:.3f} s")
        assert calm is not None and run.interval is not None and run.interval < calm / 5
    recorded = [e for e in ledger.events(state, "123") if e["kind"] == "checkpoint_interval"]
    assert [e["basis"] for e in recorded][-2:] == ["live rate", "live rate"]
    found = history.from_ledger("123", state, None)
    assert found.attempts[0].intervals[-2:] == [e["seconds"] for e in recorded][-2:]
    assert "checkpoint interval" in texts.history_text(found)


def test_an_sbatch_auto_script_makes_a_run_without_cadence_adapt_from_its_number(tmp_path):
    from slurm_preempt.job.adaptive import ENV_AUTO, from_environment

    assert from_environment({ENV_CHECKPOINT_INTERVAL: "618", ENV_AUTO: "1"}) == "auto"
    assert from_environment({ENV_CHECKPOINT_INTERVAL: "618"}) == 618
    assert from_environment({ENV_CHECKPOINT_INTERVAL: "auto"}) == "auto"
    assert from_environment({ENV_CHECKPOINT_INTERVAL: "nan"}) is None
    assert AdaptiveInterval(None, 2, {ENV_CHECKPOINT_INTERVAL: "618", ENV_AUTO: "1"}).update() == 618
