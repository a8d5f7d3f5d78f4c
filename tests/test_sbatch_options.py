"""The one declaration of sbatch's options (sbatch/optiontable.py) and what is built from it: the click
options, the [sbatch] config keys, the defaults, the docs; and ``--checkpoint-interval auto`` with its
figures learned from earlier jobs (``--learn-from``)."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from slurm_preempt.cli import main as cli_main
from slurm_preempt.cli.sbatch import command as sbatch_command
from slurm_preempt.config import Config
from slurm_preempt.errors import ConfigError, UsageError
from slurm_preempt.records.report import advise_interval
from slurm_preempt.sbatch import auto_interval, optiontable
from slurm_preempt.sbatch import render as gen
from slurm_preempt.sbatch.build import build_spec
from slurm_preempt.sbatch.spec import merge_settings
from slurm_preempt.slurm.commands import Slurm
from test_history import ev, three_attempts
from test_report import _ledger_from

# ------------------------------------------------------------------------------ one declaration


def click_options() -> list[click.Option]:
    ctx = click.Context(sbatch_command)
    return [p for p in sbatch_command.get_params(ctx) if isinstance(p, click.Option) and p.expose_value]


def test_the_command_line_is_the_table():
    """Every option of `slurm-preempt sbatch` comes from the table, under its key, and nothing else."""
    options = click_options()
    assert [p.name for p in options] == [o.key for o in optiontable.cli_options()]
    for param in options:
        declared = optiontable.BY_KEY[param.name]
        assert param.opts == [declared.flag]
        assert param.help == declared.help_text
        assert param.multiple == (declared.kind == optiontable.REPEAT)


def test_the_config_keys_are_the_tables():
    section = {key: None for key in optiontable.CONFIG_KEYS}
    merge_settings({k: v for k, v in section.items() if k not in optiontable.LIST_KEYS}, {})
    for cli_only in ("learn_from", "write", "submit", "json"):
        with pytest.raises(ConfigError, match=cli_only):
            merge_settings({cli_only: "x"}, {})
    assert "checkpoint_root" in optiontable.CONFIG_KEYS
    assert "checkpoint_root" not in {p.name for p in click_options()}


def test_every_setting_key_reaches_the_library_and_every_action_stays_in_the_cli():
    assert set(optiontable.ACTION_KEYS) == {"write", "submit", "test_only", "explain", "json"}
    assert optiontable.SETTING_KEYS.isdisjoint(optiontable.ACTION_KEYS)
    with pytest.raises(ValueError, match="checkpoint_secs"):  # a caller's typo is never ignored
        merge_settings({}, {"checkpoint_secs": "60"})
    assert {"env", "setup", "sbatch", "resume_flag", "learn_from"} == optiontable.LIST_KEYS


def test_the_defaults_used_are_the_declared_ones():
    spec = build_spec({}, ["python", "train.py"])
    defaults = optiontable.DEFAULTS
    assert spec.constraint == defaults["constraint"] == "preemptible"
    assert spec.output == defaults["output"]
    assert spec.notice_signal == defaults["notice_signal"]
    assert spec.forward_signal == defaults["forward_signal"]
    assert spec.optin.fallback_to == defaults["fallback_to"]
    assert spec.optin.fast_restart is defaults["fast_restart"] is True
    assert spec.sidecar is defaults["sidecar"] is False
    assert (spec.grace, spec.rdzv_port) == (defaults["grace"], defaults["rdzv_port"]) == (300, 29500)


def test_help_shows_each_declared_default():
    helped = CliRunner().invoke(cli_main, ["sbatch", "--help"], terminal_width=400)
    assert helped.exit_code == 0
    for option in optiontable.cli_options():
        assert option.flag in helped.output
        if option.shown_default:
            assert f"[default: {option.shown_default}]" in helped.output


def test_the_docs_table_has_a_row_per_option():
    rows = optiontable.markdown_reference().splitlines()[2:]
    assert len(rows) == len(optiontable.OPTIONS)
    for row, option in zip(rows, optiontable.OPTIONS, strict=True):
        assert (f"`{option.key}`" in row) == option.config
        assert (option.flag in row) == option.cli


def test_the_library_does_not_import_click():
    code = "import sys, slurm_preempt.sbatch.render; print('click' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"


# ------------------------------------------------------------------------------ --learn-from


@pytest.fixture
def ledger(tmp_path):
    """Job 5: three attempts, two preemptions, checkpoints of 2 s and 4 s; job 6: one attempt, none."""
    _ledger_from(tmp_path, "5", three_attempts())
    _ledger_from(
        tmp_path,
        "6",
        [
            ev("attempt_start", 0, restart_count=0, node="n", user="bob", partition="gpu"),
            ev("attempt_end", 50, restart_count=0, exit_code="0:0", hook="epilog", node="n"),
        ],
    )
    return tmp_path


def learn(ledger, *args: str):
    """The CLI on a host without sacct (PATH holds no Slurm): the figures come from the ledger alone."""
    env = {"SLURM_PREEMPT_STATE_DIR": str(ledger), "PATH": str(ledger / "no-slurm-here")}
    return CliRunner().invoke(
        cli_main, ["sbatch", "--checkpoint-interval", "auto", *args, "--", "true"], env=env
    )


def advised(checkpoint: float, mtbp: float) -> int:
    return round(advise_interval(checkpoint, mtbp)["advised_seconds"])


def test_learn_from_takes_the_reports_figures_of_a_job(ledger):
    # Job 5 ran 100 + 30 + 100.5 s with 2 preemptions (M = 115.25 s, reported 115.2) and checkpointed
    # in 2 s and 4 s (C = 3 s): the figures `slurm-preempt report` prints for it.
    result = learn(ledger, "--learn-from", "5")
    assert result.exit_code == 0, result.output
    assert f"\nexport SLURM_PREEMPT_CHECKPOINT_INTERVAL={advised(3.0, 115.2)}\n" in result.output


def test_learn_from_pools_jobs_and_the_command_line_wins(ledger):
    pooled = learn(ledger, "--learn-from", "5", "--learn-from", "6")
    assert f"SLURM_PREEMPT_CHECKPOINT_INTERVAL={advised(3.0, 140.2)}\n" in pooled.output  # (230.5 + 50) / 2
    given = learn(ledger, "--learn-from", "5", "--mtbp", "3600")
    assert f"SLURM_PREEMPT_CHECKPOINT_INTERVAL={advised(3.0, 3600.0)}\n" in given.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--learn-from", "6"], "no preemption recorded, so no time between preemptions: give --checkpoint"),
        (["--learn-from", "77"], "--learn-from 77: no attempt of job 77 recorded"),
        (["--learn-from", "../../etc"], "--learn-from '../../etc' is not a Slurm job id"),
    ],
)
def test_learn_from_says_what_is_missing_in_one_line(ledger, args, message):
    result = learn(ledger, *args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_a_job_without_preemptions_still_serves_with_mtbp_given(ledger):
    only_checkpoints = learn(ledger, "--learn-from", "6", "--mtbp", "3600")
    assert only_checkpoints.exit_code == 2 and "give --checkpoint-seconds SECONDS" in only_checkpoints.output
    both = learn(ledger, "--learn-from", "6", "--mtbp", "3600", "--checkpoint-seconds", "30")
    assert f"SLURM_PREEMPT_CHECKPOINT_INTERVAL={advised(30.0, 3600.0)}\n" in both.output


def test_learn_from_needs_auto(ledger):
    result = CliRunner().invoke(cli_main, ["sbatch", "--learn-from", "5", "--", "true"])
    assert result.exit_code == 2 and "--learn-from serves --checkpoint-interval auto" in result.output


def test_a_learned_figure_wins_over_the_configs(ledger, monkeypatch):
    no_sacct = Slurm(env={"PATH": str(ledger / "no-slurm-here")})  # the ledger alone, whatever runs
    config = Config(data={"sbatch": {"checkpoint_interval": "auto", "mtbp": 9999, "checkpoint_seconds": 1}})
    cli = {"learn_from": ("5",), "checkpoint_seconds": "30"}
    figures = auto_interval.with_learned_figures(cli, config.section("sbatch"), ledger, no_sacct)
    assert figures["mtbp"] == pytest.approx(115.2) and figures["checkpoint_seconds"] == "30"
    monkeypatch.delenv("SLURM_PREEMPT_STATE_DIR", raising=False)  # the config's state_dir, then
    made = gen.generate(cli, ["true"], Config(data={**config.data, "state_dir": str(ledger)}), no_sacct)
    assert made.spec.checkpoint_interval == str(advised(30.0, 115.2))


def test_resolve_interval_keeps_a_number_and_refuses_nonsense():
    assert auto_interval.resolve_interval("600", {}) == "600"
    assert auto_interval.resolve_interval(" AUTO ", {"checkpoint_seconds": 60, "mtbp": 3600}) == "618"
    for bad in ("-5", "0", "ten", "inf"):
        with pytest.raises(UsageError, match="positive number or auto"):
            auto_interval.resolve_interval(bad, {})


def test_auto_exports_its_number_and_lets_run_adapt_it_a_number_does_not():
    auto = ["--checkpoint-interval", "auto", "--checkpoint-seconds", "60", "--mtbp", "3600"]
    adaptive = CliRunner().invoke(cli_main, ["sbatch", *auto, "--", "true"])
    assert adaptive.exit_code == 0, adaptive.output
    assert "\nexport SLURM_PREEMPT_CHECKPOINT_INTERVAL=618\n" in adaptive.output
    assert "\nexport SLURM_PREEMPT_CHECKPOINT_INTERVAL_AUTO=1\n" in adaptive.output
    fixed = CliRunner().invoke(cli_main, ["sbatch", "--checkpoint-interval", "600", "--", "true"])
    assert fixed.exit_code == 0 and "SLURM_PREEMPT_CHECKPOINT_INTERVAL_AUTO" not in fixed.output


def test_auto_warns_when_one_checkpoint_takes_more_than_half_the_shortest_notice(caplog):
    from datetime import datetime, timedelta, timezone

    from slurm_preempt.records.attempts import Attempt, JobHistory

    t0 = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)
    told = [Attempt(0, notice_given=t0, deadline=t0 + timedelta(seconds=s), notice_source=src)
            for s, src in ((300, "slurm"), (30, "azure"))]  # fmt: skip
    histories = [JobHistory("5", attempts=told), JobHistory("6", attempts=[Attempt(0)])]
    with caplog.at_level("WARNING", logger="slurm_preempt.sbatch.auto_interval"):
        assert auto_interval.warn_if_slow(14, histories) is None
        warning = auto_interval.warn_if_slow(16, histories)
    assert warning is not None and "16s, more than half the 30s a notice from azure gives" in warning
    assert [r.getMessage() for r in caplog.records] == [f"--checkpoint-interval auto: {warning}"]
    assert auto_interval.warn_if_slow(16, [JobHistory("6", attempts=[Attempt(0)])]) is None  # never told
