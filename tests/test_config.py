"""The one config search, and the shipped example: valid TOML every reader accepts."""

from __future__ import annotations

import pytest
import tomllib

from slurm_preempt import config
from slurm_preempt.errors import ConfigError
from slurm_preempt.resources import data_dir
from slurm_preempt.sbatch import spec as sbatch_spec
from slurm_preempt.watch import settings as watchconfig


def test_search_order_and_merge(tmp_path):
    system, user, extra = tmp_path / "system.toml", tmp_path / "user.toml", tmp_path / "extra.toml"
    system.write_text('state_dir = "/sys"\n[sbatch]\npartition = "gpu"\naccount = "site"\n')
    user.write_text('[sbatch]\naccount = "me"\n')
    extra.write_text("[watch]\ninterval = 2\n")
    loaded = config.load([system, user, extra], environ={})
    assert loaded.section("sbatch") == {"partition": "gpu", "account": "me"}
    assert loaded.get("watch", "interval") == 2
    assert loaded.state_dir({}) == config.Path("/sys")
    assert loaded.state_dir({"SLURM_PREEMPT_STATE_DIR": "/env"}) == config.Path("/env")
    assert loaded.sources == [system, user, extra]


def test_search_path_uses_xdg_and_env(tmp_path):
    paths = config.search_path({"XDG_CONFIG_HOME": "/x", "SLURM_PREEMPT_CONFIG": "/e.toml"})
    assert [str(p) for p in paths] == [
        "/etc/slurm-preempt/config.toml",
        "/x/slurm-preempt/config.toml",
        "/e.toml",
    ]


def test_bad_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[sbatch\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load([bad], environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(environ={"SLURM_PREEMPT_CONFIG": str(tmp_path / "missing.toml"), "HOME": "/nonexistent"})


def test_shipped_example_is_accepted():
    example = data_dir("etc") / "slurm-preempt/config.toml.example"
    data = tomllib.loads(example.read_text())
    assert set(data) >= {"state_dir", "sbatch", "resume", "watch", "report"}
    sbatch_spec.merge_settings(data["sbatch"], {})
    watchconfig.settings_from(watchconfig.merged(data["watch"], {}))


def test_every_documented_key_is_accepted():
    """Uncomment every `# key = value` line of the example: each reader takes all of them."""
    import re

    lines = []
    for line in (data_dir("etc") / "slurm-preempt/config.toml.example").read_text().splitlines():
        match = re.match(r"^# ([a-z_]+ = .+?)(\s{2,}#.*)?$", line)
        lines.append(match.group(1) if match else line)
    data = tomllib.loads("\n".join(lines))
    assert data["watch"]["interval"] == 5 and data["resume"]["keep"] == 3
    sbatch_settings = sbatch_spec.merge_settings(data["sbatch"], {})
    spec = sbatch_spec.build_spec(sbatch_settings, ["python", "train.py"])  # every value is valid too
    assert spec.checkpoint_interval == "618" and spec.partition == "gpu"
    watchconfig.settings_from(watchconfig.merged(data["watch"], {}))
    from slurm_preempt.records.report import Prices

    assert Prices.from_config(data["report"])
