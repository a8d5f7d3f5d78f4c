"""The job side's [resume] settings: one default per key, documented where users look, and a broken
or outdated configuration that never stops a job."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import tomllib

from slurm_preempt import keytable
from slurm_preempt.job import settings
from slurm_preempt.job.settings import ResumeSettings
from slurm_preempt.resources import data_dir

DOCS = Path(__file__).resolve().parents[1] / "docs" / "resume.md"


def _value(text: str):
    value = None if text == "unset" else tomllib.loads(f"v = {text}")["v"]
    return tuple(value) if isinstance(value, list) else value


def _documented_table() -> dict:
    section = DOCS.read_text().split("## Configuration (`[resume]`)", 1)[1]
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+?) \|", section, re.MULTILINE)
    return {key: _value(default.strip().strip("`")) for key, default in rows}


def _example_section() -> dict:
    text = (data_dir("etc") / "slurm-preempt/config.toml.example").read_text()
    section = text.split("[resume]", 1)[1].split("\n[", 1)[0]
    found = re.findall(r"^# ([a-z_]+) = (.+?)(?:\s{2,}#.*)?$", section, re.MULTILINE)
    return {key: _value(value) for key, value in found}


def test_every_key_and_default_is_documented_as_it_is():
    defaults = {f.name: getattr(ResumeSettings(), f.name) for f in fields(ResumeSettings)}
    assert _documented_table() == defaults
    assert [k.name for k in keytable.keys(ResumeSettings)] == list(defaults)  # every field is a key


def test_reading_the_settings_imports_nothing_heavy():
    """A job imports this at start: no click, no jinja2, nothing of the watcher."""
    code = (
        "import sys, slurm_preempt.job.settings as s; s.from_section({'keep': 4});"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'jinja2')"
        " or m.startswith('slurm_preempt.watch')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_config_example_names_every_key():
    example = _example_section()
    assert set(example) == {f.name for f in fields(ResumeSettings)}
    assert example["deadline_after_signal"] == ResumeSettings().deadline_after_signal
    assert settings.from_section(example).requeue_exit_code == 85  # the example's own value


def test_the_old_grace_key_is_one_warning_naming_the_new_one(caplog):
    with caplog.at_level(logging.WARNING, "slurm_preempt"):
        loaded = settings.from_section({"grace": 120, "keep": 5}, "site.toml")
    assert loaded == ResumeSettings(keep=5)  # the default stands until the key is renamed
    (record,) = caplog.records
    assert "[resume] grace in site.toml is now called deadline_after_signal" in record.getMessage()
    assert "\n" not in record.getMessage()


def test_bad_values_and_unknown_keys_are_warnings_and_the_defaults_stand(caplog):
    bad = {"keep": 0, "signals": ["USR1", "NOPE"], "notice_poll": "often", "requeue_exit_code": 300, "x": 1}
    with caplog.at_level(logging.WARNING, "slurm_preempt"):
        assert settings.from_section(bad) == ResumeSettings()
    assert len(caplog.records) == len(bad)
    assert "no such signal: NOPE" in caplog.text and "unknown key [resume] x" in caplog.text
    good = settings.from_section({"signals": ["sigusr2"], "deadline_after_signal": 0, "notice_poll": 0.5})
    assert (good.signals, good.deadline_after_signal, good.notice_poll) == (("USR2",), 0.0, 0.5)


def test_an_unreadable_configuration_is_one_warning(tmp_path, monkeypatch, caplog):
    broken = tmp_path / "config.toml"
    broken.write_text("[resume\n")
    monkeypatch.setenv("SLURM_PREEMPT_CONFIG", str(broken))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    with caplog.at_level(logging.WARNING, "slurm_preempt"):
        assert settings.load() == ResumeSettings()
    assert "ignoring the configuration" in caplog.text and "not valid TOML" in caplog.text
