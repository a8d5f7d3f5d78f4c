"""Running a release from its root: what of the host is shared into it."""

from __future__ import annotations

import sys
from pathlib import Path

from slurm_preempt.rehearsal import slurmroot


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
