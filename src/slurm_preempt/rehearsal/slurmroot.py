"""Another Slurm release on this host, run from its Debian root (built once by ``rootbuild``):

- **Daemons** (munged, slurmctld, slurmd, slurmdbd) run chrooted into the root, each in a private mount
  namespace (``unshare --mount``) where /proc, /dev and /sys, the host's /etc (for users and hosts),
  and every folder that is data rather than operating system (/home, /root, /tmp, /work, ...) are
  bind-mounted at their own paths. Job scripts therefore see the same paths as on the host, as they
  would on a cluster's shared storage, and run this project's venv (a Python built against Debian 12's
  glibc runs on the newer glibc of trixie and sid). The mounts die with the namespace: nothing is
  left mounted on the host, and any number of clusters share one root.
- **Commands** on the host (``sinfo``, ``sbatch``, ``scontrol``, ...) are small wrappers in
  ``<cluster>/bin`` that run the root's client through the root's dynamic loader
  (``ld-linux --library-path ROOT/...``): no chroot, so any user may run them, from any folder, and the
  host acts as the login node. Inside the root the same wrappers find the root's own binaries. A
  configuration without ``PluginDir`` would send a client to the plugin folder compiled into it, the
  host's Slurm's on this host: for root the wrapper then mounts the root's plugins there, in a
  namespace of that one command.
- Slurm loads plugins from ``PluginDir``; the root holds a symlink at its own host path pointing to
  ``/``, so one ``PluginDir=ROOT/usr/lib/<triplet>/slurm-wlm`` is right both on the host (clients) and
  inside the root (daemons).

Users and groups come from the host: the root's /etc/passwd and /etc/group are symlinks into the host's
/etc, mounted read-only at /run/host-etc in each daemon's namespace (a user added later is seen).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_preempt.errors import MissingDependencyError
from slurm_preempt.rehearsal.rootbuild import HOST_ETC, RootInfo, ensure, root_path
from slurm_preempt.rehearsal.versions import Release

log = logging.getLogger(__name__)

# Top-level folders that make up the operating system; every other folder of the host is data and is
# shared into the root at the same path (home folders, /tmp, a checkout under /work, ...).
OS_DIRS = frozenset(
    ("bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "lost+found", "proc", "run", "sbin")
    + ("snap", "sys", "usr", "var")
)
# Run by `sh -c` in a fresh private mount namespace: mount what the root needs, then chroot.
# Arguments: ROOT, the shared paths, "--", the command inside the root.
_NAMESPACE_SCRIPT = f"""set -e
root=$1; shift
for fs in proc dev sys; do mount --rbind "/$fs" "$root/$fs"; done
mount --bind /etc "$root/{HOST_ETC}"
mount -o remount,bind,ro "$root/{HOST_ETC}"
while [ "$1" != -- ]; do
  if [ -d "$1" ]; then mkdir -p "$root$1"
  else mkdir -p "$root${{1%/*}}"; [ -e "$root$1" ] || : >"$root$1"; fi
  mount --rbind "$1" "$root$1"
  shift
done
shift
exec chroot "$root" "$@"
"""

_WRAPPER = """#!/bin/sh
# {name} of Slurm {version}, from the Debian {suite} root {root}
# (written by `slurm-preempt testcluster up`). On the host the root's own dynamic loader runs it with
# the root's libraries; inside the root, the path below leads to the root's own files.
root={root_q}
plugins={plugins_q}
set -- "$root/{loader}" --inhibit-cache --library-path {libpath_q} --argv0 {name} "$root/usr/bin/{name}" "$@"
# A configuration without PluginDir (none at all: `sinfo --version` with a two-line probe) sends the
# client to the plugin folder compiled into it, which on this host holds the host's Slurm's plugins:
# for root, show it the root's own there, in a mount namespace of this command's own.
conf=${{SLURM_CONF:-/etc/slurm/slurm.conf}}
if [ "$(id -u)" = 0 ] && [ -d "$plugins" ] && ! grep -qis '^PluginDir=' "$conf"; then
  exec unshare --mount --propagation private -- sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \\
    {name} "$root$plugins" "$plugins" "$@"
fi
exec "$@"
"""


# ---------------------------------------------------------------------------------------- sharing


def shared_paths(extra: Sequence[Path] = ()) -> list[Path]:
    """Host paths mounted into the root at the same place: every top-level folder that is not the
    operating system's, this Python when it lives in the operating system's folders, and ``extra``.
    Paths inside another one listed are left out (the parent's recursive bind brings them)."""
    found = [Path("/") / name for name in sorted(os.listdir("/")) if name not in OS_DIRS]
    found = [p for p in found if p.is_dir() and not p.is_symlink()]
    found += python_paths() + [Path(p) for p in extra]
    kept: list[Path] = []
    for path in sorted(set(found), key=lambda p: (len(p.parts), str(p))):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def python_paths() -> list[Path]:
    """This Python's interpreter and standard library when they live in the operating system's folders
    (Debian's /usr/bin/python3): a job inside the root runs the same venv. A pyenv or /opt Python is
    shared with its folder anyway."""
    base = Path(sys.base_prefix)
    if base.parts[1:2] and base.parts[1] not in OS_DIRS:
        return []
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [base / "lib" / version]
    # Every name the venv's python link passes through on its way to the binary (bin/python ->
    # /usr/bin/python3 -> python3.11): each gets the real binary bound over it in the root.
    current = Path(sys.executable)
    for _ in range(10):
        if current.parts[1:2] and current.parts[1] in OS_DIRS:
            found.append(current)
        if not current.is_symlink():
            break
        current = current.parent / os.readlink(current)
    return found


# ---------------------------------------------------------------------------------------- runtime


@dataclass
class RootRuntime:
    """A release running from its Debian root (see the module's docstring)."""

    release: Release
    cache: Path | None = None
    _info: RootInfo | None = None

    @property
    def path(self) -> Path:
        assert self.release.suite is not None
        return root_path(self.release.root_name, self.cache)

    @property
    def info(self) -> RootInfo:
        if self._info is None:
            self._info = ensure(self.release, self.cache)
        return self._info

    def check(self) -> None:
        for tool in ("unshare", "chroot", "mount"):
            if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
                raise MissingDependencyError(f"running another Slurm release needs {tool} (util-linux)")
        _ = self.info  # builds the root when it is not there yet

    def daemon_argv(self, program: str, args: Sequence[str], shared: Sequence[Path] = ()) -> list[str]:
        return self.chroot_argv([f"/usr/sbin/{program}", *args], shared)

    def chroot_argv(self, command: Sequence[str], shared: Sequence[Path] = ()) -> list[str]:
        """``command`` run chrooted into the root, in a mount namespace of its own where the host's
        data folders (and ``shared``) are at their own paths (root only)."""
        mounts = [str(p) for p in shared_paths(shared)]
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _NAMESPACE_SCRIPT,
                "slurm-preempt-root", str(self.path), *mounts, "--", *command]  # fmt: skip

    def conf_lines(self) -> list[str]:
        return [f"PluginDir={self.path}{self.info.plugin_dir}"]

    def prepare_clients(self, directory: Path) -> dict[str, str]:
        bin_dir = directory / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(bin_dir, 0o755)
        for name in self.info.clients:
            write_wrapper(bin_dir / name, name, self.path, self.info)
        return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}

    def describe(self) -> str:
        return f"{self.info.slurm_version} (Debian {self.info.suite} root {self.path})"


def write_wrapper(target: Path, name: str, root: Path, info: RootInfo) -> None:
    libpath = ":".join(f"$root{d}" for d in info.libdirs)
    text = _WRAPPER.format(
        name=name,
        version=info.slurm_version,
        suite=info.suite,
        root=root,
        root_q=shlex.quote(str(root)),
        loader=info.loader,
        libpath_q=f'"{libpath}"',
        plugins_q=shlex.quote(info.plugin_dir),
    )
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
