"""The one config search, and the shipped example: valid TOML every reader accepts."""

from __future__ import annotations

import pytest
import tomllib

from slurm_preempt import config
from slurm_preempt.errors import ConfigError
from slurm_preempt.resources import data_dir
from slurm_preempt.sbatch import build as sbatch_build
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
    spec = sbatch_build.build_spec(sbatch_settings, ["python", "train.py"])  # every value is valid too
    assert spec.checkpoint_interval == "618" and spec.partition == "gpu"
    watchconfig.settings_from(watchconfig.merged(data["watch"], {}))
    from slurm_preempt.records.report import Prices

    assert Prices.from_config(data["report"])


def test_state_dir_without_any_setting_is_the_sites_folder_when_made_else_the_users_own(tmp_path):
    """Zero-config user mode: a user's watcher and their jobs pick the same folder with no file; the
    site's folder wins once admins made it (users must read what a site daemon writes there)."""
    site = tmp_path / "site"
    env = {"HOME": "/home/alice"}
    assert config.default_state_dir(env, uid=1000, site=site) == config.Path(
        "/home/alice/.local/state/slurm-preempt"
    )
    xdg = {**env, "XDG_STATE_HOME": "/scratch/alice/state"}
    assert config.default_state_dir(xdg, uid=1000, site=site) == config.Path(
        "/scratch/alice/state/slurm-preempt"
    )
    relative = {**env, "XDG_STATE_HOME": "state"}  # the spec says a relative one is invalid: ignored
    assert config.default_state_dir(relative, uid=1000, site=site).parent == config.Path(
        "/home/alice/.local/state"
    )
    assert config.default_state_dir(env, uid=0, site=site) == site  # root's daemon makes the site folder
    site.mkdir()
    assert config.default_state_dir(env, uid=1000, site=site) == site


def test_an_explicit_state_dir_wins_over_the_default(tmp_path):
    user = tmp_path / "user.toml"
    user.write_text('state_dir = "/shared/me"\n')
    loaded = config.load([user], environ={})
    assert loaded.state_dir({"HOME": "/home/alice"}) == config.Path("/shared/me")
    assert loaded.names_state_dir({}) and not config.load([], environ={}).names_state_dir({})
    assert config.load([], environ={}).names_state_dir({"SLURM_PREEMPT_STATE_DIR": "/env"})


def test_a_user_watcher_that_cannot_write_its_folder_says_so_in_one_line(tmp_path):
    """An explicit folder keeps today's message; the site's default one says whose it is."""
    blocked = tmp_path / "file"
    blocked.write_text("")  # a folder under a file cannot be made, even by root
    with pytest.raises(
        ConfigError, match=r"alice cannot write the state folder .*file/state \(Not a directory\)"
    ):
        watchconfig.check_writable(blocked / "state", "alice")
    with pytest.raises(ConfigError, match="the site's: a slurm-preempt watcher of the admins"):
        watchconfig.check_writable(blocked / "state", "alice", chosen=False)
