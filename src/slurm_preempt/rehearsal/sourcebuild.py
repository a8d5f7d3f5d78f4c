"""A Slurm release no Debian suite packages, compiled once from its source tarball inside a Debian root.

``debootstrap --variant=minbase --include=<BUILD_PACKAGES> trixie ROOT`` brings a compiler and the
headers ``configure`` looks for (munge, MariaDB client, json-c, libyaml); the tarball is unpacked in
the root and ``configure && make && make install`` run chrooted into it (``nice``: the build shares the
machine with whatever else runs), with Slurm installed where Debian's packages put it (daemons in
/usr/sbin, clients in /usr/bin, plugins in /usr/lib/<multiarch tuple>/slurm). The same cache, lock,
``.partial`` folder and stamp as the Debian roots (``rootbuild``); the stamp also names the tarball's
sha256 and the configure options, and a root built from another tarball or with other options is
built again.

Left out of the build, because the test cluster never loads them: the documentation, slurmrestd,
sview, X11, PAM, the static libraries, and the hwloc, PMIx, UCX, NVML, RSMI, HDF5, freeipmi, rdkafka
and Lua plugins. On this project's 2-core VM beside other work: configure 14 s, make 3.5 min, 6.5 to
8.5 min in all with debootstrap and install.

The tarball: ``SP_SLURM_SOURCE`` (a file, or a folder holding it), else ``<checkout>/../shared/slurm-src``
or ``<cache>/src`` (``/var/cache/slurm-preempt/src``), by the file name ``versions.RELEASES`` gives.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import time
from pathlib import Path

from slurm_preempt.errors import ClusterError, MissingDependencyError
from slurm_preempt.rehearsal import rootbuild
from slurm_preempt.rehearsal.rootbuild import RootInfo
from slurm_preempt.rehearsal.versions import Release

log = logging.getLogger(__name__)

SOURCE_ENV = "SP_SLURM_SOURCE"
# What the build needs, and what the built daemons load at run time (the -dev packages bring their
# libraries); libpython3-stdlib and libexpat1 as in every root (the host's Python runs the jobs).
BUILD_PACKAGES = (
    "build-essential",
    "pkgconf",
    "xz-utils",
    "munge",
    "libmunge-dev",
    "libmariadb-dev",
    "libjson-c-dev",
    "libyaml-dev",
    "libpython3-stdlib",
    "libexpat1",
)
# Debian's multiarch tuple for this machine (where its packages put libraries and Slurm's plugins): the
# root is debootstrapped for the host's own architecture. Most are `<uname -m>-linux-gnu`; these are not.
MULTIARCH_EXCEPTIONS = {
    "ppc64le": "powerpc64le-linux-gnu",
    "i686": "i386-linux-gnu",
    "i586": "i386-linux-gnu",
    "armv7l": "arm-linux-gnueabihf",
    "armv6l": "arm-linux-gnueabi",
}


def multiarch(machine: str) -> str:
    """``x86_64`` -> ``x86_64-linux-gnu``, ``ppc64le`` -> ``powerpc64le-linux-gnu`` (Debian's tuples)."""
    return MULTIARCH_EXCEPTIONS.get(machine, f"{machine}-linux-gnu")


TRIPLET = multiarch(platform.machine())
CONFIGURE = (
    "--prefix=/usr",
    "--sysconfdir=/etc/slurm",
    "--localstatedir=/var",
    f"--libdir=/usr/lib/{TRIPLET}",
    # One slurmd per node on one host (`slurmd -N NAME`, every node NodeHostname=localhost), as
    # Debian builds it: without it slurmctld keeps one node per host name and cannot reach the others
    # ("_fwd_tree_get_addr: can't find address for host pre1"), so no job ever launches.
    "--enable-multiple-slurmd",
    "--disable-static",
    "--disable-dependency-tracking",
    "--disable-debug",
    "--disable-slurmrestd",
    "--disable-sview",
    "--disable-x11",
    "--enable-cgroupv2=no",
    "--without-rpath",
    "--without-readline",
) + tuple(
    f"--without-{name}"
    for name in ("hwloc", "pmix", "ucx", "nvml", "rsmi", "hdf5", "freeipmi", "rdkafka", "lua")
)
# Slurm's client commands, as its packages name them; the stamp lists those the build installed.
CLIENTS = (
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab",
    "scrun", "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger",
)  # fmt: skip
BUILD_TIMEOUT = 3600.0  # the build took 6.5 to 8.5 min on two busy cores
# Run chrooted into the new root: $1 the tarball (inside the root), $2 make's job count, then configure's
# options. Only src/ (libraries, daemons, clients, plugins) and the headers are built and installed: the
# documentation (its HTML needs Python), the test suite and the example configurations are not. The
# build tree and the tarball are removed once installed.
_BUILD_SCRIPT = """set -eu
tarball=$1 jobs=$2; shift 2
rm -rf /usr/src/slurm-build && mkdir -p /usr/src/slurm-build && cd /usr/src/slurm-build
tar -xf "$tarball" --strip-components=1
echo "== configure $*"
./configure "$@"
echo "== make -j$jobs -C src"
make -j"$jobs" -C src
echo "== make install"
make -C src install
make install-pkgincludeHEADERS
ldconfig
cd / && rm -rf /usr/src/slurm-build "$tarball"
"""
# What builds the chroot's view: its own /proc, /dev, /sys in a private mount namespace.
_CHROOT_SCRIPT = """set -e
root=$1; shift
for fs in proc dev sys; do mount --rbind "/$fs" "$root/$fs"; done
exec chroot "$root" "$@"
"""
# slurm_version.h: 0x190b07 is 25.11.7 (a byte each).
_VERSION = re.compile(r"#define\s+SLURM_VERSION_NUMBER\s+0x([0-9a-fA-F]{6})\b")


def find_source(release: Release, cache: Path | None = None) -> Path | None:
    """The tarball ``release`` is built from, or None when none of the places holds it."""
    assert release.source is not None
    override = os.environ.get(SOURCE_ENV, "").strip()
    if override:
        given = Path(override)
        candidates = [given / release.source if given.is_dir() else given]
    else:
        checkout = Path(__file__).resolve().parents[3]  # an editable install: the checkout's root
        candidates = [
            checkout.parent / "shared" / "slurm-src" / release.source,
            (cache or rootbuild.CACHE_DIR) / "src" / release.source,
        ]
    return next((path for path in candidates if path.is_file()), None)


def missing_source_message(release: Release, cache: Path | None = None) -> str:
    """One line saying where the tarball was looked for and how to give it."""
    return (
        f"Slurm {release.name} is built from {release.source}, which is not here: set {SOURCE_ENV} to "
        f"the tarball, or put it in {(cache or rootbuild.CACHE_DIR) / 'src'}"
    )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure(release: Release, cache: Path | None = None) -> RootInfo:
    """The root of ``release``, compiled now from its tarball when the cache holds none built from it.
    Without the tarball, a root already built is used as it is."""
    path = rootbuild.root_path(release.root_name, cache)
    source = find_source(release, cache)
    if source is None:
        built = rootbuild.read_info(path)
        if built is None or not built.source_sha256:
            raise MissingDependencyError(missing_source_message(release, cache))
        log.info("no %s here: using the root built from it in %s", release.source, path)
        return built
    checksum = sha256(source)
    return rootbuild.ensure_root(
        release,
        path,
        lambda info: (
            (info.source_sha256, info.packages, info.options) == (checksum, BUILD_PACKAGES, CONFIGURE)
        ),
        lambda partial, build_log: _build(release, partial, build_log, source, checksum),
    )


def _build(release: Release, partial: Path, build_log: Path, source: Path, checksum: str) -> RootInfo:
    began = time.monotonic()
    log.info("building Slurm %s from %s in a Debian %s root (once; 6 to 9 min on 2 cores)", release.name,
             source, release.suite)  # fmt: skip
    assert release.suite is not None
    rootbuild.debootstrap(release, partial, build_log, BUILD_PACKAGES)
    inside = Path("/usr/src") / source.name
    shutil.copyfile(source, partial / str(inside).lstrip("/"))
    jobs = str(max(1, os.cpu_count() or 1))
    argv = ["nice", "-n", "10", "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            _CHROOT_SCRIPT, "slurm-preempt-build", str(partial), "/bin/sh", "-c", _BUILD_SCRIPT,
            "slurm-build", str(inside), jobs, *CONFIGURE]  # fmt: skip
    _run_build(argv, build_log, release)
    info = describe(partial, release.suite, time.monotonic() - began, checksum)
    log.info("Slurm %s built in %.0f s (%s)", info.slurm_version, info.build_seconds, build_log)
    return info


def _run_build(argv: list[str], build_log: Path, release: Release) -> None:
    too_long = f"building Slurm {release.name} took over {BUILD_TIMEOUT:g} s"
    returncode = rootbuild.run_logged(argv, build_log, BUILD_TIMEOUT, too_long)
    if returncode != 0:
        text = build_log.read_text(errors="replace")
        stage = next((ln for ln in reversed(text.splitlines()) if ln.startswith("== ")), "== setup")
        raise ClusterError(
            f"building Slurm {release.name} failed at {stage[3:].split()[0]} (exit {returncode}); "
            f"see {build_log}"
        )


def describe(root: Path, suite: str, seconds: float, checksum: str) -> RootInfo:
    """The stamp of a root Slurm was installed into by ``make install``."""
    header = root / "usr/include/slurm/slurm_version.h"
    found = _VERSION.search(header.read_text(errors="replace")) if header.is_file() else None
    if found is None:
        raise ClusterError(f"the {suite} root holds no installed Slurm (no version in {header})")
    number = int(found.group(1), 16)
    version = f"{number >> 16}.{(number >> 8) & 0xFF:02d}.{number & 0xFF}"
    plugin_dir = f"/usr/lib/{TRIPLET}/slurm"
    if not (root / plugin_dir.lstrip("/") / "auth_munge.so").is_file():
        raise ClusterError(f"the {suite} root holds no Slurm plugins (auth_munge.so); see its build log")
    return RootInfo(
        suite=suite,
        slurm=version,
        loader=rootbuild.find_loader(root, suite),
        libdirs=(f"/usr/lib/{TRIPLET}", plugin_dir),
        plugin_dir=plugin_dir,
        clients=tuple(name for name in CLIENTS if (root / "usr/bin" / name).is_file()),
        built_at=time.time(),
        build_seconds=round(seconds, 1),
        mirror=rootbuild.MIRROR,
        packages=BUILD_PACKAGES,
        source_sha256=checksum,
        options=CONFIGURE,
    )
