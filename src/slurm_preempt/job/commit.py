"""How a checkpoint folder becomes visible, is replaced and goes away: the store's commit protocol.

Layout of a store folder::

    step-000000000042/            a committed checkpoint: MANIFEST.json and its files
    step-000000000042.1/          the same step saved again later: the highest generation wins
    .tmp-<host>-<pid>-<nonce>/    a save in progress; .owner inside says who writes it
    .del-<host>-<pid>-<nonce>/    a checkpoint being deleted (invisible since its rename)
    .old-<host>-<pid>-step-N/     left only by versions before generations existed: a step renamed
                                  aside during a re-save; read as a fallback and put back by a sweep

``commit`` makes a fully written folder visible: it fsyncs the folder and renames it to the next free
generation of its step, then fsyncs the store folder. rename(2) never replaces a non-empty folder, so a
lost race retries with the next generation and no save ever overwrites another. Replacing a step thus
never removes the old generation before the new one is visible: a reader sees a complete checkpoint of
that step at every instant, and a kill between any two steps leaves the old or the new one.

Leftovers (a saver killed mid-save, a deletion cut short) are swept by any host: a folder is stale when
its ``.owner`` says so, i.e. the same host and boot and pid namespace but that process is gone (pid and
its start time, so a reused pid does not count), or the same Slurm job at an earlier restart count (Slurm
runs one attempt of a job at a time), or else when its heartbeat (the mtime of .owner, refreshed while
the save runs) is older than ``STALE_AFTER``, measured against the mtime of a file this process just
wrote in the same folder, so both times come from the same (file server's) clock.
Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_preempt import procinfo
from slurm_preempt.durable import fsync_dir
from slurm_preempt.job.checkpoint_io import fs_step
from slurm_preempt.job.snapshot import OWNER_FILE

PREFIX = "step-"
HEARTBEAT = 60.0  # seconds between refreshes of a running save's .owner
STALE_AFTER = 900.0  # a leftover of another host whose heartbeat is older than this is swept


def step_name(step: int, generation: int = 0) -> str:
    base = f"{PREFIX}{int(step):012d}"
    return base if generation == 0 else f"{base}.{generation}"


def parse_name(name: str) -> tuple[int, int] | None:
    """(step, generation) of a committed folder's name, else None."""
    if not name.startswith(PREFIX):
        return None
    digits, dot, generation = name[len(PREFIX) :].partition(".")
    if not digits.isdigit() or (dot and not generation.isdigit()):
        return None
    return int(digits), int(generation or 0)


def committed(directory: Path) -> list[tuple[int, int, str]]:
    """(step, generation, name) of every committed folder, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(*parsed, name) for name in names if (parsed := parse_name(name)) is not None]
    return sorted(found)


def newest_generations(directory: Path) -> dict[int, str]:
    """step -> name of its newest generation."""
    return {step: name for step, _gen, name in committed(directory)}


def legacy_asides(directory: Path) -> list[tuple[int, str]]:
    """(step, name) of folders renamed aside by an older version's re-save (``.old-H-P-step-N``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((step, name) for name in names if (step := aside_step(name)) is not None)


def aside_step(name: str) -> int | None:
    """The step of a ``.old-<host>-<pid>-step-N`` folder, else None."""
    if not name.startswith(".old-") or "-" + PREFIX not in name:
        return None
    parsed = parse_name(name[name.rindex("-" + PREFIX) + 1 :])
    return None if parsed is None or parsed[1] else parsed[0]


# ---------------------------------------------------------------------------------------- owners


def _short_host(host: str) -> str:
    return host.split(".", maxsplit=1)[0].replace("-", "_")


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """Start tick of ``pid`` as ``.owner`` holds it (decimal text, "" when unknown): tells a reused pid
    apart."""
    ticks = procinfo.start_ticks(pid)
    return "" if ticks is None else str(ticks)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class Owner:
    """Who writes a scratch folder: enough for any host to tell whether that save can still finish."""

    host: str
    pid: int
    boot_id: str = ""
    pid_namespace: str = ""
    pid_start: str = ""
    job_id: str = ""
    restart_count: int = -1  # -1: not a Slurm job (or unknown)

    @classmethod
    def current(cls, host: str | None = None, environ: dict | None = None) -> Owner:
        env = os.environ if environ is None else environ
        restarts = (env.get("SLURM_RESTART_COUNT") or "0").strip()
        job_id = (env.get("SLURM_JOB_ID") or "").strip()
        return cls(
            host=host or socket.gethostname(),
            pid=os.getpid(),
            boot_id=_read("/proc/sys/kernel/random/boot_id"),
            pid_namespace=_pid_namespace(),
            pid_start=_process_start(os.getpid()),
            job_id=job_id,
            restart_count=int(restarts) if job_id and restarts.isdigit() else -1,
        )

    @classmethod
    def from_json(cls, data: object) -> Owner | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                host=str(data["host"]),
                pid=int(data["pid"]),
                boot_id=str(data.get("boot_id", "")),
                pid_namespace=str(data.get("pid_namespace", "")),
                pid_start=str(data.get("pid_start", "")),
                job_id=str(data.get("job_id", "")),
                restart_count=int(data.get("restart_count", -1)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def same_process_space(self, other: Owner) -> bool:
        """True when ``other.pid`` can be checked from here: same host, boot and pid namespace."""
        if self.host != other.host:
            return False
        return all(not (a and b) or a == b for a, b in self._spaces(other))

    def _spaces(self, other: Owner) -> list[tuple[str, str]]:
        return [(self.boot_id, other.boot_id), (self.pid_namespace, other.pid_namespace)]

    def gone(self, me: Owner) -> bool | None:
        """True: this writer can no longer finish; False: it may; None: only its age can tell."""
        if self.host == me.host:
            if any(a and b and a != b for a, b in self._spaces(me)):
                return self.boot_id != me.boot_id or None  # rebooted: gone; another container: ask age
            return not process_running(self.pid, self.pid_start)
        if self.job_id and self.job_id == me.job_id and 0 <= self.restart_count < me.restart_count:
            return True  # Slurm runs one attempt of a job at a time: an earlier attempt is over
        return None


def process_running(pid: int, start: str = "") -> bool:
    """True while process ``pid`` exists and, when ``start`` is known, is the one that started then."""
    if start and procinfo.available():
        return _process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _legacy_owner(name: str) -> Owner | None:
    """Host and pid from a scratch name ``.kind-<host>-<pid>-...`` (folders without an .owner)."""
    parts = name.split("-", 3)
    if len(parts) < 4 or not parts[2].isdigit():
        return None
    return Owner(host=parts[1], pid=int(parts[2]))


# ---------------------------------------------------------------------------------------- scratch


class Scratch:
    """A folder being written, with its owner record and heartbeat."""

    def __init__(self, directory: Path, owner: Owner, name: str | None = None):
        """``name``: a ``.tmp-`` name the caller drew, for a folder several writers share (the ranks of
        a sharded save; one of them may have made it already); by default one of this owner's own."""
        self.owner = owner
        shared = name is not None
        if name is None:
            name = f".tmp-{_short_host(owner.host)}-{owner.pid}-{os.urandom(4).hex()}"
        elif not name.startswith(".tmp-") or "/" in name:
            raise ValueError(f"a scratch folder is named .tmp-...: {name!r}")
        self.path = directory / name
        fs_step("mkdir scratch")
        try:
            os.mkdir(self.path)
        except FileExistsError:
            if not shared:
                raise
        try:
            fs_step("write owner")
            record = self.path / OWNER_FILE
            record.write_text(json.dumps(asdict(owner)))
            self.started = record.stat().st_mtime  # "now" by the file server's clock
        except BaseException:
            remove_tree(self.path)  # disk full: leave nothing behind
            raise
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def start_heartbeat(self, every: float = HEARTBEAT) -> None:
        self._beat = threading.Thread(target=self._heartbeat, args=(every,), daemon=True)
        self._beat.start()

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                os.utime(self.path / OWNER_FILE)
            except OSError:
                return

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None

    def commit(self, step: int) -> Path:
        self.stop_heartbeat()
        fs_step("remove owner")
        (self.path / OWNER_FILE).unlink(missing_ok=True)
        return commit(self.path.parent, self.path, step)

    def abort(self) -> None:
        self.stop_heartbeat()
        remove_tree(self.path)


def commit(directory: Path, folder: Path, step: int) -> Path:
    """Make ``folder`` (files and MANIFEST.json already durable) checkpoint ``step`` of ``directory``:
    fsync it, rename it to the next free generation, fsync ``directory``. The one way in, for any writer
    (a sharded layer writes its parts into a folder and calls this once)."""
    fs_step("fsync folder")
    fsync_dir(folder)
    for _ in range(1000):
        existing = [gen for s, gen, _name in committed(directory) if s == step]
        target = directory / step_name(step, max(existing) + 1 if existing else 0)
        fs_step("rename into place")
        try:
            os.rename(folder, target)
            break
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    else:
        raise OSError(errno.EEXIST, f"no free name for step {step} in {directory}")
    fs_step("fsync store folder")
    fsync_dir(directory)
    return target


# ---------------------------------------------------------------------------------------- removal


def retire(directory: Path, name: str, owner: Owner) -> None:
    """Delete a committed folder: rename it out of sight first, then remove its files."""
    trash = directory / f".del-{_short_host(owner.host)}-{owner.pid}-{os.urandom(4).hex()}"
    fs_step("rename to trash")
    try:
        os.rename(directory / name, trash)
    except FileNotFoundError:
        return  # someone else retired it
    remove_tree(trash)


def remove_tree(path: Path) -> None:
    """Remove a folder bottom-up, one fs step at a time; vanished entries are fine (another remover)."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        entries = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            remove_tree(Path(entry.path))
        else:
            fs_step("unlink")
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
    fs_step("rmdir")
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        os.unlink(path)


def prune(directory: Path, keep: int, owner: Owner) -> None:
    """Keep the newest generation of the newest ``keep`` steps; retire everything older."""
    entries = committed(directory)
    newest = {step: gen for step, gen, _name in entries}
    kept = set(sorted(newest)[-keep:])
    for step, gen, name in entries:
        if step not in kept or gen != newest[step]:
            retire(directory, name, owner)


def sweep(directory: Path, me: Owner, now: float | None = None, stale_after: float = STALE_AFTER) -> None:
    """Remove leftovers whose writer is gone, put back aside folders of older versions."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    now = time.time() if now is None else now
    for name in names:
        path = directory / name
        if name.startswith(".del-"):
            remove_tree(path)
        elif name.startswith((".tmp-", ".old-")) and _stale(path, name, me, now, stale_after):
            if name.startswith(".tmp-"):
                remove_tree(path)
            else:
                _restore_aside(directory, name)


def _stale(path: Path, name: str, me: Owner, now: float, stale_after: float) -> bool:
    record_path = path / OWNER_FILE
    try:
        record = Owner.from_json(json.loads(record_path.read_text()))
    except (OSError, ValueError):
        record = None
    writer = record or _legacy_owner(name)
    verdict = None if writer is None else writer.gone(_comparable(me, writer, record is None))
    if verdict is not None:
        return verdict
    try:
        beat = (record_path if record is not None else path).stat().st_mtime
    except FileNotFoundError:
        return False  # committed or removed meanwhile
    return now - beat > stale_after


def _comparable(me: Owner, writer: Owner, legacy: bool) -> Owner:
    # Names carry the short host with "-" replaced; compare like with like.
    return Owner(host=_short_host(me.host), pid=me.pid) if legacy else me


def _restore_aside(directory: Path, name: str) -> None:
    step = aside_step(name)
    if step is None:
        return
    if any(s == step for s, _gen, _name in committed(directory)):
        remove_tree(directory / name)  # the re-save arrived: this copy is superseded
        return
    fs_step("rename aside back")
    try:
        os.rename(directory / name, directory / step_name(step))
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            remove_tree(directory / name)  # a save of that step arrived meanwhile
        elif exc.errno != errno.ENOENT:
            raise
