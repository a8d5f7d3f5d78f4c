"""Building a release's root: one clear line when it cannot be built, never half a root."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from slurm_preempt.errors import ClusterError, MissingDependencyError
from slurm_preempt.rehearsal import rootbuild, versions


def test_building_without_debootstrap_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(MissingDependencyError, match="apt-get install debootstrap"):
        rootbuild.ensure(versions.release("24.11"), cache=tmp_path)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("debootstrap"), reason="needs root and debootstrap")
def test_an_unreachable_registry_is_one_clear_line(monkeypatch, tmp_path):
    """A real debootstrap against a mirror nobody listens on: one line, nothing half-built left."""
    monkeypatch.setattr(rootbuild, "MIRROR", "http://127.0.0.1:9/debian")
    with pytest.raises(ClusterError) as error:
        rootbuild.ensure(versions.release("24.11"), cache=tmp_path)
    message = str(error.value)
    assert "cannot reach Debian's registry http://127.0.0.1:9/debian" in message and "\n" not in message
    assert sorted(p.name for p in (tmp_path / "roots").iterdir()) == [".trixie.lock", "trixie.log"]


def test_a_root_that_moved_on_is_refused(tmp_path):
    info = rootbuild.RootInfo(
        suite="sid", slurm="26.11.1-1", loader="lib64/ld-linux-x86-64.so.2", libdirs=(), plugin_dir="/x",
        clients=("sinfo",), built_at=0.0, build_seconds=1.0, mirror="m", packages=rootbuild.PACKAGES,
    )  # fmt: skip
    root = tmp_path / "roots" / "sid"
    (root / "etc").mkdir(parents=True)
    (root / rootbuild.STAMP).write_text(json.dumps(info.to_json()))
    with pytest.raises(ClusterError, match="holds Slurm 26.11.1, not 26.05"):
        rootbuild.ensure(versions.release("26.05"), cache=tmp_path)
