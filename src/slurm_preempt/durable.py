"""Durable file writes: the one protocol for small files (checkpoint data has its own, job/checkpoint_io.py).

``write_atomic`` is how every small file is written (notices, the watcher's state, ledger events,
installed hooks, agreement rounds, the test cluster's state): a reader sees the old file or the new
one, never half of either. It is safe in a folder that another user owns, which is the ledger's case
(root's hooks and the watcher write into ``jobs/<id>/``, which belongs to the job's user): the folder
is opened once, the temporary file is created in it by name relative to that open folder
(``O_EXCL|O_NOFOLLOW``: never an existing file or link the user put there), its mode is set on the
open descriptor (never by path), and the rename happens inside the same open folder. A user who swaps
names in their folder meanwhile can at worst lose the new file; they can never make the writer
follow a link, change the mode of another file or write anywhere else. The folder itself is opened
without following a symlink, unless that symlink belongs to root or to the writer (an admin's
``/etc/slurm -> /shared/slurm/etc``; never a link another user planted), and is refused when anyone
may write it without the sticky bit (anyone could then swap the new file for their own).

``open_dir`` is the same rule for the folders themselves, for root's installation (``hooks install``):
it walks the path from ``/`` one folder at a time, each opened relative to the one before without
following another user's symlink, creates what is missing, refuses a folder that another user owns or
that anyone may write without the sticky bit (whoever can rename entries there can swap what comes
next), and hands back a descriptor on which the caller sets owner and mode (``fchown``, ``fchmod``):
nothing is ever chowned or chmodded through a path a user controls.

Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path | str, data: bytes | str, mode: int = 0o644, sync: bool = True, trusted: bool = False
) -> Path:
    """Replace ``path`` with a new file holding ``data`` (mode ``mode``, whatever the umask).

    ``sync``: fsync the file before the rename and the folder after it, so the new content survives
    a crash of the machine; False where the file only matters while its writers live.
    ``trusted``: every folder on the way must be root's or the writer's (``open_dir``), for files root
    runs or believes (installed hooks, their configuration).
    The temporary name starts with a dot (readers skip those; Slurm's ``prolog.d/*`` glob does not
    match them) and ends in ``.tmp``. Raises OSError; nothing is left behind on failure.
    """
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    folder = open_dir(path.parent, trusted=True) if trusted else _open_folder(path.parent)
    try:
        tmp, fd = _create_temp(folder, path.name, mode)
        try:
            try:
                os.fchmod(fd, mode)
                _write_all(fd, payload)
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            _unlink_quietly(tmp, folder)
            raise
        if sync:
            os.fsync(folder)
    finally:
        os.close(folder)
    return path


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _open_folder(folder: Path) -> int:
    try:
        fd = os.open(folder, _DIR_FLAGS | os.O_NOFOLLOW)
    except OSError as exc:  # a symlink: ENOTDIR with O_DIRECTORY, ELOOP without
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not os.path.islink(folder):
            raise
        owner = os.lstat(folder).st_uid
        if owner not in (0, os.geteuid()):
            raise PermissionError(
                errno.EPERM, f"not following a symlink of uid {owner} as the folder to write in", str(folder)
            ) from None
        fd = os.open(folder, _DIR_FLAGS)
    return _checked(fd, folder, trusted=False)


def open_dir(path: Path | str, create: int | None = None, trusted: bool = True) -> int:
    """A descriptor of folder ``path``, reached one folder at a time from ``/``; the caller closes it.

    Missing folders are created with mode ``create`` (None: FileNotFoundError). Each folder on the way
    is refused (PermissionError) when anyone may write it without the sticky bit, and with ``trusted``
    also when another user than root or the caller owns it; a symlink on the way is followed only when
    root or the caller owns it. Set owner and mode on the descriptor, never on the path.
    """
    path = Path(os.path.abspath(path))
    fd = _checked(os.open("/", _DIR_FLAGS), Path("/"), trusted)
    here = Path("/")
    for name in path.parts[1:]:
        here = here / name
        try:
            child = _open_child(fd, name, here, create)
        finally:
            os.close(fd)
        fd = _checked(child, here, trusted)  # closes the child when it refuses it
    return fd


def _open_child(parent: int, name: str, here: Path, create: int | None) -> int:
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        if create is None:
            raise
        try:
            os.mkdir(name, create, dir_fd=parent)
        except FileExistsError:  # made meanwhile: opened (and checked) like any other
            pass
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    info = os.lstat(name, dir_fd=parent)
    if not os.path.islink(here) or info.st_uid not in (0, os.geteuid()):
        raise PermissionError(errno.EPERM, f"not a folder, or a symlink of uid {info.st_uid}", str(here))
    return os.open(name, _DIR_FLAGS, dir_fd=parent)  # an admin's own link (/etc/slurm -> /shared/...)


def _checked(fd: int, where: Path, trusted: bool) -> int:
    """``fd`` when its folder is safe to work in; closed and PermissionError otherwise."""
    info = os.fstat(fd)
    why = ""
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        why = f"anyone may write it (mode {stat.S_IMODE(info.st_mode):o}) and it has no sticky bit"
    elif trusted and info.st_uid not in (0, os.geteuid()):
        why = f"it belongs to uid {info.st_uid}, who could swap what is in it"
    if why:
        os.close(fd)
        raise PermissionError(errno.EPERM, f"refusing the folder: {why}", str(where))
    return fd


def _create_temp(folder: int, name: str, mode: int) -> tuple[str, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _attempt in range(100):
        tmp = f".{name}.{_random_suffix()}.tmp"
        try:
            return tmp, os.open(tmp, flags, mode & 0o777, dir_fd=folder)
        except FileExistsError:  # taken (by chance, or by someone planting names): draw another
            continue
    raise FileExistsError(f"no free temporary name for {name} after 100 tries")


def _random_suffix() -> str:
    return os.urandom(6).hex()


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]


def _unlink_quietly(name: str, folder: int) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass
