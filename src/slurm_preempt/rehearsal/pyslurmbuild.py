"""pyslurm built once against a source-built root's libslurm, for the tests and the bench of the watcher's
pyslurm backend (``slurm/pyslurm_backend.py``) on that release.

Why inside the root: libslurm 25.11 compiled in Debian trixie needs GLIBC_2.38, and this project's
Python (built on Debian 12, glibc 2.36) cannot load it on the host. That same Python runs inside the
root (trixie's newer glibc loads it; the daemons' namespaces already run the jobs' venv there), so
pyslurm is compiled chrooted into the root, with the root's compiler and Slurm headers and this
Python's headers, and its poll runs there too (``RootRuntime.chroot_argv``).

The sdist and its build requirements (Cython, setuptools, wheel, packaging) are downloaded on the host
by pip, as its configuration says; the build inside the root reads only them (``--no-index``). The
result is installed with ``pip --target`` into ``<cache>/roots/<root>.pyslurm-<version>-<python>``
beside the root, under the same lock and ``.partial`` rule as the root itself, with a stamp naming the
root's tarball checksum: a root built again gets pyslurm built again. The root is never written to.
On this project's 2-core VM beside other work: the download ~1 min, the compile 12 to 15 min.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from slurm_preempt.errors import ClusterError
from slurm_preempt.rehearsal import rootbuild, sourcebuild
from slurm_preempt.rehearsal.slurmroot import RootRuntime
from slurm_preempt.rehearsal.versions import Release

log = logging.getLogger(__name__)

# The pyslurm release that speaks each source-built Slurm release's API (PyPI carries these).
PYSLURM = {"25.11": "25.11.2"}
REQUIREMENTS = ("Cython>=3.0.11", "setuptools>=59.2", "wheel>=0.37", "packaging>=21.3")
STAMP = ".slurm-preempt-pyslurm.json"
TIMEOUT = 3600.0
PYTHON_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def target(release: Release, cache: Path | None = None) -> Path:
    """Where pyslurm for ``release`` and this Python is installed (a folder for PYTHONPATH)."""
    root = rootbuild.root_path(release.root_name, cache)
    return root.with_name(f"{root.name}.pyslurm-{PYSLURM[release.name]}-{PYTHON_TAG}")


def ensure(release: Release, cache: Path | None = None) -> Path:
    """pyslurm for ``release`` (built now when the cache holds none for its root); its folder."""
    if release.name not in PYSLURM:
        raise ClusterError(f"no pyslurm release is known for Slurm {release.name}")
    runtime = RootRuntime(release, cache)
    info = sourcebuild.ensure(release, cache)
    folder = target(release, cache)
    with rootbuild._lock(folder):
        if _stamp(folder) == _wanted(release, info.source_sha256):
            return folder
        _build(release, runtime, folder, info.source_sha256)
    return folder


def _wanted(release: Release, checksum: str) -> dict[str, str]:
    return {"pyslurm": PYSLURM[release.name], "python": PYTHON_TAG, "root_source_sha256": checksum}


def _stamp(folder: Path) -> dict[str, str] | None:
    try:
        found = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return {k: found.get(k) for k in ("pyslurm", "python", "root_source_sha256")}


def _build(release: Release, runtime: RootRuntime, folder: Path, checksum: str) -> None:
    began = time.monotonic()
    build_log = folder.with_name(folder.name + ".log")
    build_log.write_text("")
    version = PYSLURM[release.name]
    log.info("building pyslurm %s against Slurm %s in %s (once; ~15 min on 2 cores)", version,
             release.name, runtime.path)  # fmt: skip
    # Inside /tmp: a folder every root's namespace shares at its own path, so the root is not written.
    with tempfile.TemporaryDirectory(prefix="slurm-preempt-pyslurm-") as work:
        downloads, installed = Path(work) / "downloads", Path(work) / "installed"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "download", "-q", "-d", str(downloads), f"pyslurm=={version}", *REQUIREMENTS], build_log)
        inside = [*pip, "install", "--no-index", "--find-links", str(downloads), "--target", str(installed),
                  "--no-deps", f"pyslurm=={version}"]  # fmt: skip
        env_prefix = ["env", f"SLURM_LIB_DIR=/usr/lib/{sourcebuild.TRIPLET}/slurm",
                      "SLURM_INCLUDE_DIR=/usr/include", "PYSLURM_BUILD_JOBS=2",
                      "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]  # fmt: skip
        _run(["nice", "-n", "10", *runtime.chroot_argv([*env_prefix, *inside])], build_log)
        stamp = {**_wanted(release, checksum), "build_seconds": round(time.monotonic() - began, 1)}
        (installed / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(installed, partial, symlinks=True)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    log.info("pyslurm %s built in %.0f s (%s)", version, time.monotonic() - began, build_log)


def _run(argv: list[str], build_log: Path) -> None:
    returncode = rootbuild.run_logged(argv, build_log, TIMEOUT, f"building pyslurm took over {TIMEOUT:g} s")
    if returncode != 0:
        tail = build_log.read_text(errors="replace").strip().splitlines()[-1:]
        raise ClusterError(f"building pyslurm failed (exit {returncode}: {' '.join(tail)}); see {build_log}")


def describe(folder: Path) -> str:
    """One line: the pyslurm a folder holds and how long it took to build."""
    found = json.loads((folder / STAMP).read_text())
    return (
        f"pyslurm {found['pyslurm']} for {found['python']} in {folder} (built in {found['build_seconds']} s)"
    )


__all__ = ("PYSLURM", "describe", "ensure", "target")
