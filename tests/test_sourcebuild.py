"""A release compiled from its source tarball: where the tarball is found, one line when it is not,
a root rebuilt only when the tarball changes (its checksum in the stamp), never half a root.
The real build runs where the cluster tests of 25.11 run (scripts/test.sh, `--slurm 25.11`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_preempt.errors import ClusterError, MissingDependencyError
from slurm_preempt.rehearsal import rootbuild, sourcebuild, versions

RELEASE = versions.release("25.11")


@pytest.fixture
def tarball(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "given" / "slurm-25.11.7.tar.xz"
    path.parent.mkdir()
    path.write_bytes(b"not really xz")
    monkeypatch.setenv(sourcebuild.SOURCE_ENV, str(path))
    return path


def test_the_release_is_built_from_its_tarball_in_a_root_of_its_own():
    assert RELEASE.suite == "trixie" and RELEASE.source == "slurm-25.11.7.tar.xz"
    assert RELEASE.root_name == "trixie-slurm-25.11"
    assert versions.release("24.11").root_name == "trixie"  # never the same folder


def test_the_override_names_a_file_or_a_folder(tarball, monkeypatch, tmp_path):
    assert sourcebuild.find_source(RELEASE, tmp_path) == tarball
    monkeypatch.setenv(sourcebuild.SOURCE_ENV, str(tarball.parent))
    assert sourcebuild.find_source(RELEASE, tmp_path) == tarball
    monkeypatch.setenv(sourcebuild.SOURCE_ENV, str(tmp_path / "nowhere.tar.xz"))
    assert sourcebuild.find_source(RELEASE, tmp_path) is None


def test_the_cache_folder_is_searched_without_an_override(monkeypatch, tmp_path):
    monkeypatch.delenv(sourcebuild.SOURCE_ENV, raising=False)
    monkeypatch.setattr(sourcebuild, "__file__", str(tmp_path / "a/b/c/d/sourcebuild.py"))
    assert sourcebuild.find_source(RELEASE, tmp_path) is None
    dropped = tmp_path / "src" / "slurm-25.11.7.tar.xz"
    dropped.parent.mkdir()
    dropped.write_bytes(b"x")
    assert sourcebuild.find_source(RELEASE, tmp_path) == dropped


def test_no_tarball_and_no_root_is_one_line_saying_how_to_give_it(monkeypatch, tmp_path):
    monkeypatch.setenv(sourcebuild.SOURCE_ENV, str(tmp_path / "missing"))
    with pytest.raises(MissingDependencyError) as error:
        rootbuild.ensure(RELEASE, cache=tmp_path)
    message = str(error.value)
    assert "\n" not in message and "slurm-25.11.7.tar.xz" in message and "SP_SLURM_SOURCE" in message
    assert not (tmp_path / "roots" / RELEASE.root_name).exists()


def _fake_build(calls: list[str], version: int = 0x190B07):
    """Stands in for debootstrap + make: a root with what ``describe`` reads."""

    def build(release, partial, build_log, source, checksum):
        calls.append(checksum)
        (partial / "etc").mkdir(parents=True)
        (partial / "lib64").mkdir()
        (partial / "lib64/ld-linux-x86-64.so.2").write_bytes(b"")
        (partial / "usr/include/slurm").mkdir(parents=True)
        (partial / "usr/include/slurm/slurm_version.h").write_text(
            f"#define SLURM_VERSION_NUMBER {version:#08x}\n"
        )
        plugins = partial / f"usr/lib/{sourcebuild.TRIPLET}/slurm"
        plugins.mkdir(parents=True)
        (plugins / "auth_munge.so").write_bytes(b"")
        (partial / "usr/bin").mkdir()
        for name in ("sinfo", "sbatch"):
            (partial / "usr/bin" / name).write_bytes(b"")
        return sourcebuild.describe(partial, release.suite, 1.0, checksum)

    return build


@pytest.mark.skipif(os.geteuid() != 0, reason="building a root needs root")
def test_a_root_is_built_once_per_tarball(tarball, monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(sourcebuild, "_build", _fake_build(calls))
    info = rootbuild.ensure(RELEASE, cache=tmp_path)
    root = tmp_path / "roots" / RELEASE.root_name
    stamp = json.loads((root / rootbuild.STAMP).read_text())
    assert stamp["source_sha256"] == sourcebuild.sha256(tarball) == info.source_sha256
    assert info.slurm_version == "25.11.7" and info.clients == ("sbatch", "sinfo")
    assert info.plugin_dir == f"/usr/lib/{sourcebuild.TRIPLET}/slurm"
    assert not root.with_name(root.name + ".partial").exists()
    rootbuild.ensure(RELEASE, cache=tmp_path)
    assert len(calls) == 1  # the same tarball: the cached root
    tarball.write_bytes(b"another tarball")
    rootbuild.ensure(RELEASE, cache=tmp_path)
    assert calls == [info.source_sha256, sourcebuild.sha256(tarball)]
    monkeypatch.setattr(sourcebuild, "CONFIGURE", (*sourcebuild.CONFIGURE, "--with-something"))
    rootbuild.ensure(RELEASE, cache=tmp_path)
    assert len(calls) == 3  # other configure options: built again
    # Without the tarball the root built from it is still used.
    monkeypatch.setenv(sourcebuild.SOURCE_ENV, str(tmp_path / "gone"))
    assert rootbuild.ensure(RELEASE, cache=tmp_path).source_sha256 == calls[-1] and len(calls) == 3
    listed = rootbuild.list_roots(tmp_path)
    assert [(r["name"], r["slurm"]) for r in listed] == [(RELEASE.root_name, "25.11.7")]


@pytest.mark.skipif(os.geteuid() != 0, reason="building a root needs root")
def test_a_failed_build_leaves_only_its_log(tarball, monkeypatch, tmp_path):
    def broken(release, partial, build_log, source, checksum):
        (partial / "usr").mkdir(parents=True)
        build_log.write_text("== configure\nconfigure: error: munge not found\n")
        raise ClusterError("building Slurm 25.11 failed at configure (exit 1)")

    monkeypatch.setattr(sourcebuild, "_build", broken)
    with pytest.raises(ClusterError, match="failed at configure"):
        rootbuild.ensure(RELEASE, cache=tmp_path)
    names = sorted(p.name for p in (tmp_path / "roots").iterdir())
    assert names == [f".{RELEASE.root_name}.lock", f"{RELEASE.root_name}.log"]


@pytest.mark.skipif(os.geteuid() != 0, reason="building a root needs root")
def test_a_tarball_of_another_release_is_refused(tarball, monkeypatch, tmp_path):
    monkeypatch.setattr(sourcebuild, "_build", _fake_build([], version=0x190503))
    with pytest.raises(ClusterError, match="holds Slurm 25.05.3, not 25.11: the tarball"):
        rootbuild.ensure(RELEASE, cache=tmp_path)


def test_a_failing_build_step_is_named_in_one_line(tmp_path):
    build_log = tmp_path / "build.log"
    build_log.write_text("")
    argv = ["/bin/sh", "-c", "echo '== configure --prefix=/usr'; echo 'error: no munge'; exit 1"]
    with pytest.raises(ClusterError) as error:
        sourcebuild._run_build(argv, build_log, RELEASE)
    assert "failed at configure (exit 1)" in str(error.value) and "\n" not in str(error.value)


def test_the_multiarch_tuple_follows_the_machine_as_debian_names_it():
    """Plugins and libraries go where the root's Debian packages put theirs: /usr/lib/<tuple>."""
    assert sourcebuild.multiarch("x86_64") == "x86_64-linux-gnu"
    assert sourcebuild.multiarch("aarch64") == "aarch64-linux-gnu"
    assert sourcebuild.multiarch("ppc64le") == "powerpc64le-linux-gnu"
    assert sourcebuild.multiarch("armv7l") == "arm-linux-gnueabihf"
    assert f"--libdir=/usr/lib/{sourcebuild.TRIPLET}" in sourcebuild.CONFIGURE
