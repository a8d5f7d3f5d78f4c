"""Other Slurm releases: the release table, the roots' build errors, what is shared into a root."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_preempt.cli import main
from slurm_preempt.errors import ClusterError, MissingDependencyError, UsageError
from slurm_preempt.rehearsal import slurmroot, versions
from slurm_preempt.rehearsal import testcluster as tc


def test_releases_and_their_suites():
    assert {name: r.suite for name, r in versions.RELEASES.items()} == {
        "system": None,
        "24.11": "trixie",
        "26.05": "sid",
    }
    assert versions.release("26.05").version == (26, 5)
    with pytest.raises(UsageError, match="choose one of system, 24.11, 26.05"):
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


def test_shared_paths_are_the_hosts_data_folders_not_its_system(tmp_path):
    shared = slurmroot.shared_paths([Path("/tmp/inside/tmp"), tmp_path])
    assert Path("/tmp") in shared
    assert not {Path("/usr"), Path("/etc"), Path("/var"), Path("/proc")} & set(shared)
    assert Path("/tmp/inside/tmp") not in shared  # /tmp brings it
    assert all(p.is_absolute() for p in shared)


def test_a_python_of_the_system_folders_is_shared_by_its_files(monkeypatch, tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to("/usr/bin/python3")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    found = slurmroot.python_paths()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert found[0] == Path(f"/usr/lib/{version}")
    assert Path("/usr/bin/python3") in found
    monkeypatch.setattr(sys, "base_prefix", "/root/.pyenv/versions/3.11.7")
    assert slurmroot.python_paths() == []


def test_building_without_debootstrap_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(MissingDependencyError, match="apt-get install debootstrap"):
        slurmroot.ensure(versions.release("24.11"), cache=tmp_path)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("debootstrap"), reason="needs root and debootstrap")
def test_an_unreachable_registry_is_one_clear_line(monkeypatch, tmp_path):
    """A real debootstrap against a mirror nobody listens on: one line, nothing half-built left."""
    monkeypatch.setattr(slurmroot, "MIRROR", "http://127.0.0.1:9/debian")
    with pytest.raises(ClusterError) as error:
        slurmroot.ensure(versions.release("24.11"), cache=tmp_path)
    message = str(error.value)
    assert "cannot reach Debian's registry http://127.0.0.1:9/debian" in message and "\n" not in message
    assert sorted(p.name for p in (tmp_path / "roots").iterdir()) == [".lock", "trixie.log"]


def test_a_root_that_moved_on_is_refused(tmp_path):
    info = slurmroot.RootInfo(
        suite="sid", slurm="26.11.1-1", loader="lib64/ld-linux-x86-64.so.2", libdirs=(), plugin_dir="/x",
        clients=("sinfo",), built_at=0.0, build_seconds=1.0, mirror="m", packages=slurmroot.PACKAGES,
    )  # fmt: skip
    root = tmp_path / "roots" / "sid"
    (root / "etc").mkdir(parents=True)
    (root / slurmroot.STAMP).write_text(__import__("json").dumps(info.to_json()))
    with pytest.raises(ClusterError, match="holds Slurm 26.11.1, not 26.05"):
        slurmroot.ensure(versions.release("26.05"), cache=tmp_path)
