"""The Slurm releases the test cluster runs, and the environment that points commands at one."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_preempt.cli import main
from slurm_preempt.errors import UsageError
from slurm_preempt.rehearsal import testcluster as tc
from slurm_preempt.rehearsal import versions


def test_releases_and_their_suites():
    assert {name: r.suite for name, r in versions.RELEASES.items()} == {
        "system": None,
        "24.11": "trixie",
        "25.11": "trixie",
        "26.05": "sid",
    }
    assert versions.release("26.05").version == (26, 5)
    with pytest.raises(UsageError, match="choose one of system, 24.11, 25.11, 26.05"):
        versions.release("23.02")


def test_cli_refuses_an_unknown_release(tmp_path):
    result = CliRunner().invoke(main, ["testcluster", "up", "--slurm", "23.02", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "'23.02' is not one of" in result.output


def test_env_puts_the_release_commands_first(tmp_path):
    folder = tmp_path / "with space"
    state = tc.ClusterState(spec=tc.ClusterSpec(directory=folder, slurm="24.11"))
    assert state.env()["PATH"].startswith(f"{folder}/bin:")
    lines = tc.env_lines(state)
    assert f"export PATH='{folder}/bin':\"$PATH\"" in lines
    assert f"export SLURM_CONF='{folder}/etc/slurm.conf'" in lines
    assert "PATH" not in tc.ClusterState(spec=tc.ClusterSpec(directory=folder)).env()
