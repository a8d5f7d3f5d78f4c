"""rehearsal/pyslurmbuild.py: where pyslurm for a source-built release goes, and that it is built once
per root (its stamp names the root's tarball). The build itself runs in CI's 25.11 tier
(`testcluster roots --pyslurm 25.11`) and in tests/test_pyslurm_cluster.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from slurm_preempt.errors import ClusterError
from slurm_preempt.rehearsal import pyslurmbuild, sourcebuild, versions

RELEASE = versions.release("25.11")


def test_pyslurm_goes_beside_the_root_named_by_its_release_and_python(tmp_path):
    folder = pyslurmbuild.target(RELEASE, tmp_path)
    assert folder.parent == tmp_path / "roots"
    assert folder.name == f"trixie-slurm-25.11.pyslurm-25.11.2-{pyslurmbuild.PYTHON_TAG}"


def test_a_release_without_a_pyslurm_is_refused():
    with pytest.raises(ClusterError, match="no pyslurm release is known for Slurm 24.11"):
        pyslurmbuild.ensure(versions.release("24.11"))


def _stamped(tmp_path, checksum: str):
    folder = pyslurmbuild.target(RELEASE, tmp_path)
    folder.mkdir(parents=True)
    stamp = {"pyslurm": "25.11.2", "python": pyslurmbuild.PYTHON_TAG, "root_source_sha256": checksum,
             "build_seconds": 700.0}  # fmt: skip
    (folder / pyslurmbuild.STAMP).write_text(json.dumps(stamp))
    return folder


def test_built_once_per_root(tmp_path, monkeypatch):
    folder = _stamped(tmp_path, "abc")
    built = []
    monkeypatch.setattr(sourcebuild, "ensure", lambda release, cache: SimpleNamespace(source_sha256="abc"))
    monkeypatch.setattr(pyslurmbuild, "_build", lambda *args: built.append(args))
    assert pyslurmbuild.ensure(RELEASE, tmp_path) == folder and not built
    assert "built in 700.0 s" in pyslurmbuild.describe(folder)
    monkeypatch.setattr(sourcebuild, "ensure", lambda release, cache: SimpleNamespace(source_sha256="new"))
    pyslurmbuild.ensure(RELEASE, tmp_path)
    assert len(built) == 1  # the root was built from another tarball: pyslurm is built again
