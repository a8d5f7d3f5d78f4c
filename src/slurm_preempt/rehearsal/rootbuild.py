"""The Debian roots that hold other Slurm releases: built once with debootstrap, kept in a cache folder.

``debootstrap --variant=minbase --include=slurmctld,slurmd,slurm-client,slurmdbd,munge,... trixie ROOT``
unpacks Debian 13's Slurm 24.11 (suite ``sid``: 26.05) into ``/var/cache/slurm-preempt/roots/<suite>``
in under a minute. A build goes to ``<suite>.partial`` under that root's own lock (a second caller
waits for the first one's root) and is renamed into place once its stamp
(``etc/slurm-preempt-root.json``: the Slurm version, loader, library and plugin folders, client
commands, package list) is written; a failed build leaves only its log. A root whose package list is
not this module's is built again; one whose suite moved on to another Slurm is refused with a message
saying so. ``sourcebuild`` compiles a release no suite ships (25.11) into such a root, with the same
lock, ``.partial`` and stamp. ``slurmroot`` runs daemons and commands from a root.

Built once, a root is adapted for use from the host: its /etc/passwd, group, hosts and localtime are
symlinks into the host's /etc (mounted at /run/host-etc in each daemon's namespace, so a user added
later is seen), a symlink at the root's own host path points to ``/`` (so one ``PluginDir`` spelled as on
the host is right inside the root too), and the downloaded packages, documentation and translations are
removed.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slurm_preempt.errors import ClusterError, MissingDependencyError
from slurm_preempt.rehearsal.versions import Release

log = logging.getLogger(__name__)

CACHE_DIR = Path(os.environ.get("SLURM_PREEMPT_CACHE", "/var/cache/slurm-preempt"))
MIRROR = os.environ.get("SLURM_PREEMPT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# libpython3-stdlib brings the shared libraries Python's own modules link (ssl, ffi, sqlite, lzma, ...)
# for the host's Python that jobs run, without naming the t64-renamed packages of each suite; Debian's
# own python3 binary also links libexpat. A root built with another list is built again.
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "libpython3-stdlib", "libexpat1")
BUILD_TIMEOUT = 1800.0
STAMP = "etc/slurm-preempt-root.json"  # written last: a root without it is incomplete
HOST_ETC = "run/host-etc"  # where each daemon namespace mounts the host's /etc, read-only
HOST_FILES = ("passwd", "group", "hosts", "localtime")  # the root's /etc/X -> /run/host-etc/X
# debootstrap's words for "the registry could not be reached".
_UNREACHABLE = re.compile(
    r"Failed getting release file|Couldn't download|Temporary failure resolving|"
    r"Could not resolve|Connection (refused|timed out)|No route to host|Network is unreachable",
    re.IGNORECASE,
)


_LISTS = ("libdirs", "clients", "packages", "options")  # the stamp's lists (tuples here)


@dataclass(frozen=True)
class RootInfo:
    """What a built root holds (its stamp file)."""

    suite: str
    slurm: str  # the Debian package version, e.g. 24.11.5-4+deb13u1
    loader: str  # relative to the root: lib64/ld-linux-x86-64.so.2
    libdirs: tuple[str, ...]  # absolute inside the root
    plugin_dir: str  # absolute inside the root
    clients: tuple[str, ...]  # sinfo, squeue, ...
    built_at: float
    build_seconds: float
    mirror: str
    packages: tuple[str, ...] = ()
    source_sha256: str = ""  # the tarball a root built from source was compiled from
    options: tuple[str, ...] = ()  # and the configure options it was compiled with

    @property
    def slurm_version(self) -> str:
        """``24.11.5`` from ``24.11.5-4+deb13u1``."""
        return self.slurm.split("-")[0].split("+")[0]

    def to_json(self) -> dict:
        return {**self.__dict__, **{k: list(getattr(self, k)) for k in _LISTS}}

    @classmethod
    def from_json(cls, data: dict) -> RootInfo:
        lists = {k: tuple(data.get(k, ())) for k in _LISTS}
        return cls(**{**data, **lists})


def root_path(suite: str, cache: Path | None = None) -> Path:
    return (cache or CACHE_DIR) / "roots" / suite


def read_info(path: Path) -> RootInfo | None:
    """The stamp of the root at ``path``, or None when it is missing or incomplete."""
    try:
        return RootInfo.from_json(json.loads((path / STAMP).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure(release: Release, cache: Path | None = None) -> RootInfo:
    """The root of ``release``, built now when it is not in the cache yet (once: concurrent callers
    wait for the first one's build). A release built from source goes to ``sourcebuild``."""
    if release.suite is None:
        raise ClusterError("the system release runs from the host's packages, not from a root")
    if release.source is not None:
        from slurm_preempt.rehearsal import sourcebuild

        return sourcebuild.ensure(release, cache)
    return ensure_root(
        release,
        root_path(release.root_name, cache),
        lambda info: info.packages == PACKAGES,
        lambda partial, build_log: _build(release, partial, build_log),
    )


def ensure_root(
    release: Release,
    path: Path,
    is_current: Callable[[RootInfo], bool],
    build: Callable[[Path, Path], RootInfo],
) -> RootInfo:
    """The root at ``path`` when its stamp ``is_current``; else ``build(partial, log)`` fills
    ``<path>.partial``, which is adapted and renamed into place (under the cache's lock: concurrent
    callers wait for the first one's build; a failed build leaves only its log)."""
    info = read_info(path)
    if info is None or not is_current(info):
        with _lock(path):
            info = read_info(path)
            if info is not None and not is_current(info):
                log.info("the %s root was built from other inputs: building it again", path.name)
                _remove(path)
                info = None
            info = info or _build_into(release, path, build)
    _check_version(release, info, path)
    return info


def _remove(path: Path) -> None:
    """Move a root aside, then delete it (rmtree never follows its self-link or the host's files)."""
    aside = path.with_name(path.name + ".old")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def list_roots(cache: Path | None = None) -> list[dict]:
    """Every root in the cache: suite, Slurm version, size on disk, build time."""
    found = []
    folder = (cache or CACHE_DIR) / "roots"
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        info = read_info(path) if path.is_dir() and not path.is_symlink() else None
        if info is not None:
            found.append(
                {
                    "name": path.name,
                    "suite": info.suite,
                    "slurm": info.slurm_version,
                    "source_sha256": info.source_sha256 or None,
                    "path": str(path),
                    "built_at": info.built_at,
                    "build_seconds": info.build_seconds,
                    "megabytes": _megabytes(path),
                }
            )
    return found


def _megabytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):  # never follows the root's self-link
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total // 1_000_000


@contextmanager
def _lock(root: Path) -> Iterator[None]:
    """One lock per root (``.<name>.lock`` beside it): a root compiled from source for minutes never
    holds up the build of another."""
    folder = root.parent
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder.parent, 0o755)  # users' commands run the roots' clients
    with open(folder / f".{root.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _check_version(release: Release, info: RootInfo, path: Path) -> None:
    wanted = release.name
    if info.slurm_version.startswith(wanted + "."):
        return
    if release.source is not None:
        raise ClusterError(
            f"the root in {path} holds Slurm {info.slurm_version}, not {wanted}: the tarball it was "
            f"built from is another release's; remove {path} and give Slurm {wanted}'s tarball"
        )
    raise ClusterError(
        f"the Debian {info.suite} root in {path} holds Slurm {info.slurm_version}, not {wanted}: "
        f"Debian {info.suite} moved on; remove {path} to rebuild it, and update "
        "slurm_preempt.rehearsal.versions.RELEASES"
    )


def _build_into(release: Release, path: Path, build: Callable[[Path, Path], RootInfo]) -> RootInfo:
    if os.geteuid() != 0:
        raise ClusterError(f"building the Slurm {release.name} root runs debootstrap, which needs root")
    partial = path.with_name(path.name + ".partial")
    build_log = path.with_name(path.name + ".log")
    shutil.rmtree(partial, ignore_errors=True)  # an interrupted build; rmtree never follows symlinks
    try:
        build_log.write_text("")
        info = build(partial, build_log)
        _adapt(partial, path)
        (partial / STAMP).write_text(json.dumps(info.to_json(), indent=1) + "\n")
        os.replace(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # never half a root (the log stays)
        raise
    return info


def _build(release: Release, partial: Path, build_log: Path) -> RootInfo:
    assert release.suite is not None
    log.info("building the Debian %s root with Slurm %s (once; about a minute)", release.suite, release.name)
    began = time.monotonic()
    debootstrap(release, partial, build_log, PACKAGES)
    info = _describe(partial, release.suite, time.monotonic() - began)
    log.info("root ready: Slurm %s in %.0f s (%s)", info.slurm_version, info.build_seconds, build_log)
    return info


def debootstrap(release: Release, target: Path, build_log: Path, packages: tuple[str, ...]) -> None:
    """Unpack release's Debian suite with ``packages`` into ``target`` (output appended to the log)."""
    found = shutil.which("debootstrap", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        raise MissingDependencyError(
            f"building the Slurm {release.name} root needs debootstrap: apt-get install debootstrap "
            "(scripts/install-slurm.sh installs it)"
        )
    assert release.suite is not None
    argv = [found, "--variant=minbase", f"--include={','.join(packages)}", release.suite, str(target), MIRROR]
    _run_debootstrap(argv, build_log, release)


def run_logged(argv: list[str], build_log: Path, timeout: float, too_long: str) -> int:
    """Run ``argv`` with its output appended to ``build_log``; its exit status. ClusterError saying
    ``too_long`` when it runs past ``timeout`` seconds."""
    with open(build_log, "a") as out:
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{too_long}; see {build_log}") from None
    return done.returncode


def _run_debootstrap(argv: list[str], build_log: Path, release: Release) -> None:
    too_long = (
        f"debootstrap of Debian {release.suite} gave no result within {BUILD_TIMEOUT:g} s "
        f"(is {MIRROR} slow or unreachable?)"
    )
    returncode = run_logged(argv, build_log, BUILD_TIMEOUT, too_long)
    if returncode == 0:
        return
    text = build_log.read_text(errors="replace")
    if _UNREACHABLE.search(text):
        raise ClusterError(
            f"cannot reach Debian's registry {MIRROR} to build the Slurm {release.name} root "
            f"(set SLURM_PREEMPT_DEBIAN_MIRROR to a reachable mirror); see {build_log}"
        )
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    raise ClusterError(f"debootstrap of Debian {release.suite} failed (exit {returncode}): {last}")


# What a test root never reads: the downloaded packages (~50 MB), documentation and translations.
PRUNE = ("var/cache/apt/archives", "usr/share/doc", "usr/share/man", "usr/share/locale")


def _adapt(partial: Path, final: Path) -> None:
    """Make the fresh root usable from the host: host users, self-link for PluginDir; prune it."""
    for folder in PRUNE:
        for entry in (partial / folder).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            elif entry.suffix == ".deb" or folder != PRUNE[0]:
                entry.unlink()
    (partial / HOST_ETC).mkdir(parents=True, exist_ok=True)
    for name in HOST_FILES:
        target = partial / "etc" / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(f"/{HOST_ETC}/{name}")
    # ROOT/<ROOT's host path> -> /: paths spelled as on the host resolve inside the root too.
    link = partial / str(final).lstrip("/")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("/")


def _describe(root: Path, suite: str, seconds: float) -> RootInfo:
    listed = (root / "var/lib/dpkg/info/slurm-client.list").read_text().split()
    clients = tuple(sorted(Path(p).name for p in listed if p.startswith("/usr/bin/")))
    plugin = next(iter(sorted(root.glob("usr/lib/*/slurm-wlm/auth_munge.so"))), None)
    if plugin is None:
        raise ClusterError(f"the {suite} root holds no Slurm plugins (auth_munge.so); see its build log")
    plugin_dir = "/" + str(plugin.parent.relative_to(root))
    libdirs = ("/" + str(plugin.parent.parent.relative_to(root)), plugin_dir)
    return RootInfo(
        suite=suite,
        slurm=_package_version(root, "slurm-client"),
        loader=find_loader(root, suite),
        libdirs=libdirs,
        plugin_dir=plugin_dir,
        clients=clients,
        built_at=time.time(),
        build_seconds=round(seconds, 1),
        mirror=MIRROR,
        packages=PACKAGES,
    )


def find_loader(root: Path, suite: str) -> str:
    """The root's dynamic loader, relative to the root (lib64/ld-linux-x86-64.so.2)."""
    for pattern in ("lib64/ld-linux*.so.*", "lib/ld-linux*.so.*"):
        for found in sorted(root.glob(pattern)):
            return str(found.relative_to(root))
    raise ClusterError(f"the {suite} root holds no dynamic loader")


def _package_version(root: Path, package: str) -> str:
    status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    for block in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if fields.get("Package") == package and "installed" in fields.get("Status", ""):
            return fields.get("Version", "")
    raise ClusterError(f"{package} is not installed in the root {root}")
