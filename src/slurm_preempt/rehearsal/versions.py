"""The Slurm releases the local test cluster runs, and how it runs each.

``system`` is the host's own packages (Debian 12: Slurm 22.05). The others come from a Debian suite
that ships them, unpacked once with debootstrap into a cache folder (``rootbuild``), or, for a release
no Debian suite packages (25.11), are compiled once from Slurm's source tarball inside such a root
(``sourcebuild``). The daemons run chrooted into the root and the host's ``sinfo``/``sbatch``/...
become wrappers that run that release's clients (``slurmroot``), so the watcher, the drill and the
tests run unchanged against it.

A runtime answers three questions for ``testcluster``: which argv starts a daemon, which slurm.conf
lines it needs, and which environment makes the host's Slurm commands talk to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slurm_preempt.errors import MissingDependencyError, UsageError
from slurm_preempt.rehearsal.procs import which

SYSTEM = "system"


@dataclass(frozen=True)
class Release:
    """One Slurm release the test cluster can run."""

    name: str  # what --slurm takes: "system", "24.11", "25.11", "26.05"
    suite: str | None  # the Debian suite of its root; None: the host's packages
    note: str = ""
    # The source tarball it is compiled from inside a root of ``suite`` (None: the suite ships it).
    source: str | None = None

    @property
    def root_name(self) -> str:
        """The root's folder in the cache: the suite's name, or ``<suite>-slurm-<name>`` for a
        release built from source (its root holds no Debian Slurm packages)."""
        assert self.suite is not None, "the host's packages have no root"
        return f"{self.suite}-slurm-{self.name}" if self.source else self.suite

    @property
    def version(self) -> tuple[int, int] | None:
        """(24, 11) for "24.11"; None for the host's packages (ask ``sinfo --version``)."""
        if self.suite is None:
            return None
        major, minor = self.name.split(".")
        return int(major), int(minor)


# The releases CI proves (README "Supported" lists exactly these). Debian sid moves on: when it ships
# another Slurm, building its root fails with a message saying which one, and this table changes.
RELEASES: Mapping[str, Release] = {
    SYSTEM: Release(SYSTEM, None, "the host's packages (Debian 12: Slurm 22.05)"),
    "24.11": Release("24.11", "trixie", "Debian 13"),
    # No Debian suite packages 25.11: built from the tarball of tag slurm-25-11-7-1 (sourcebuild).
    "25.11": Release("25.11", "trixie", "built from source", source="slurm-25.11.7.tar.xz"),
    "26.05": Release("26.05", "sid", "Debian unstable"),
}


def release(name: str) -> Release:
    """The release called ``name``, or a UsageError listing the choices."""
    found = RELEASES.get(name.strip())
    if found is None:
        raise UsageError(f"unknown Slurm release {name!r}: choose one of {', '.join(RELEASES)}")
    return found


class Runtime(Protocol):
    """How ``testcluster`` starts daemons of one release and points Slurm commands at them."""

    release: Release

    def check(self) -> None:
        """Raise MissingDependencyError (or build what is missing) before anything starts."""

    def daemon_argv(self, program: str, args: Sequence[str], shared: Sequence[Path]) -> list[str]:
        """The argv that runs ``program`` (munged, slurmctld, slurmd, slurmdbd) with ``args``."""
        ...

    def conf_lines(self) -> list[str]:
        """Lines slurm.conf needs for this release."""
        ...

    def prepare_clients(self, directory: Path) -> dict[str, str]:
        """Write what the host's Slurm commands need under ``directory``; return the environment."""
        ...

    def describe(self) -> str:
        """One line for ``status``: the release and where it runs from."""
        ...


# Binaries of the host's packages and the Debian package that brings each (Debian 13 names them
# slurmd-wlm etc. behind alternatives, which still answer to these names).
SYSTEM_REQUIRED = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sinfo": "slurm-client"}


@dataclass
class SystemRuntime:
    """The host's own Slurm packages: daemons and commands straight from the host."""

    release: Release = RELEASES[SYSTEM]

    def check(self) -> None:
        missing = sorted({pkg for binary, pkg in SYSTEM_REQUIRED.items() if not which(binary)})
        if missing:
            raise MissingDependencyError(
                f"Slurm packages missing: {' '.join(missing)}; install them with "
                f"`apt-get install {' '.join(missing)}` or run scripts/install-slurm.sh"
            )

    def daemon_argv(self, program: str, args: Sequence[str], shared: Sequence[Path] = ()) -> list[str]:
        found = which(program)
        if found is None:
            raise MissingDependencyError(f"{program} is not installed on this host")
        return [found, *args]

    def conf_lines(self) -> list[str]:
        return []

    def prepare_clients(self, directory: Path) -> dict[str, str]:
        return {}

    def describe(self) -> str:
        return "system (the host's Slurm packages)"


def client_env(name: str, directory: Path, path: str) -> dict[str, str]:
    """The environment that makes Slurm commands (``path`` being the caller's PATH) those of release
    ``name`` for the cluster in ``directory``: nothing for the host's own, else its wrappers first."""
    if release(name).suite is None:
        return {}
    return {"PATH": f"{directory / 'bin'}:{path}"}


def runtime(name: str) -> Runtime:
    """The runtime for release ``name`` (``system``, ``24.11``, ``25.11``, ``26.05``)."""
    chosen = release(name)
    if chosen.suite is None:
        return SystemRuntime(chosen)
    from slurm_preempt.rehearsal.slurmroot import RootRuntime

    return RootRuntime(chosen)
