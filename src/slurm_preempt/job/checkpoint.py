"""The checkpoint store: a checkpoint is complete or invisible.

Layout of a store folder (the commit protocol and leftovers: ``commit.py``; one checkpoint and its
loading: ``stored_checkpoint.py``)::

    <dir>/step-000000000042/          one complete checkpoint
            state.pkl  state.buffers  (or data.bin, state.pt, or the files you saved)
            MANIFEST.json             written last: step, sizes, checksum of every file, metadata
    <dir>/step-000000000042.1/        step 42 saved again: the highest generation wins
    <dir>/.tmp-<host>-<pid>-<nonce>/  a save in progress (never read; swept once its writer is gone)

A save writes every file under the scratch folder (durably, checksummed while written, see
``checkpoint_io.py``), writes the manifest last, and commits: the folder is fsynced and renamed to the
next free generation of its step, the store folder fsynced. Older checkpoints are pruned afterwards, on a
helper thread, off the caller's path. A process killed at any point leaves the previous checkpoints or
the new one, never a torn one and never none. Loading verifies the manifest (sizes and checksums) and
falls back to the previous good checkpoint with a warning.

Checksum: XXH3 (``checksum.py``; CRC-32 where xxhash is missing, and older checkpoints still verify),
named in the manifest and computed beside the I/O on a helper thread; it detects damage, not tampering.
Import-light: standard library only.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, overload

from slurm_preempt.durable import fsync_dir
from slurm_preempt.errors import CheckpointError
from slurm_preempt.job import checksum, commit
from slurm_preempt.job.checkpoint_io import Damaged, copy_file, fs_step, stream_file, write_file
from slurm_preempt.job.commit import PREFIX, Owner, step_name
from slurm_preempt.job.formats import PickleFormat, WholeFormat
from slurm_preempt.job.snapshot import MANIFEST, Snapshot, snapshot_of_paths
from slurm_preempt.job.stored_checkpoint import Checkpoint

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DEFAULT_KEEP = 3
__all__ = ["DEFAULT_KEEP", "PREFIX", "Checkpoint", "CheckpointStore", "step_name"]


class CheckpointStore:
    """Atomic checkpoints in one folder; keeps the last ``keep``; background saves optional.

    ``format`` says how a save writes its payload (``job/formats.py``: ``PickleFormat()``, the default,
    or ``TorchFormat()``; a sharded checkpoint is written by every rank together, through ``Run``).
    ``warn`` receives each warning (a damaged checkpoint skipped, an older step saved); by default it
    is logged (``slurm_preempt.job.checkpoint``, level WARNING). ``owner`` says who writes (host,
    process, Slurm job and restart; default: this process), for the sweep of leftovers. Background
    saves copy into memory kept for the next one (one copy of the state stays allocated between
    saves); ``reuse_buffers=False`` frees it after each save.
    """

    def __init__(
        self,
        directory: Path | str,
        keep: int = DEFAULT_KEEP,
        warn: Callable[[str], None] | None = None,
        owner: Owner | None = None,
        reuse_buffers: bool = True,
        *,
        format: WholeFormat | None = None,
    ):
        if keep < 1:
            raise CheckpointError(f"keep must be at least 1, not {keep}")
        if format is not None and format.sharded:
            raise CheckpointError(
                "a sharded checkpoint is written by every rank together: Run(format=ShardedFormat())"
            )
        self._directory = Path(directory)
        self._keep = keep
        self._format: WholeFormat = PickleFormat() if format is None else format
        self._warn = warn if warn is not None else log.warning
        self._owner = owner
        self._reuse = reuse_buffers
        self._stagings: dict[type, Any] = {}  # format class -> memory its background saves copy into
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last: Checkpoint | None = None
        self._tidy: threading.Thread | None = None
        self._swept = False

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def keep(self) -> int:
        """How many checkpoints (steps) stay after a save."""
        return self._keep

    @property
    def format(self) -> WholeFormat:
        return self._format

    @property
    def owner(self) -> Owner:
        if self._owner is None:
            self._owner = Owner.current()
        return self._owner

    # ------------------------------------------------------------------------------------ saving

    @overload
    def save(
        self, step: int, payload: Any, meta: Mapping | None = None, *, background: Literal[False] = False
    ) -> Checkpoint: ...

    @overload
    def save(
        self, step: int, payload: Any, meta: Mapping | None = None, *, background: bool
    ) -> Checkpoint | None: ...

    def save(
        self, step: int, payload: Any, meta: Mapping | None = None, *, background: bool = False
    ) -> Checkpoint | None:
        """Write ``payload`` as checkpoint ``step`` in the store's format.

        Synchronous (the default): written from the payload's own buffers (live tensors for
        ``TorchFormat``), no copy; returns the Checkpoint once durable. ``background=True``: copies the
        payload now (into memory kept from the previous background save), writes it on a helper thread
        and returns None; ``wait()`` returns that Checkpoint. One save in flight: any save first waits
        for the previous one and raises CheckpointError if it failed."""
        return self._save(int(step), payload, meta, background, self._format)

    def save_paths(self, step: int, paths: Iterable[Path | str], meta: Mapping | None = None) -> Checkpoint:
        """Copy files and folders (under their base names) into checkpoint ``step``; for shell jobs."""
        self.wait()
        return self._write(int(step), snapshot_of_paths(paths), dict(meta or {}))

    def _save(
        self, step: int, payload: Any, meta: Mapping | None, background: bool, fmt: WholeFormat
    ) -> Checkpoint | None:
        """The one way a payload is saved (``save`` and the deprecated aliases come here)."""
        self.wait()
        if not background:
            return self._write(step, fmt.snapshot(payload), dict(meta or {}))
        snap = fmt.snapshot(payload, self._staging_for(fmt))
        self._start_background(step, snap, dict(meta or {}))
        return None

    def _staging_for(self, fmt: WholeFormat) -> Any:
        """The memory a background save in ``fmt`` copies into: kept for the next one unless
        ``reuse_buffers=False``."""
        staging = self._stagings.get(type(fmt)) if self._reuse else None
        if staging is None:
            staging = fmt.staging()
            if self._reuse:
                self._stagings[type(fmt)] = staging
        return staging

    def _start_background(self, step: int, snap: Snapshot, meta: dict) -> None:
        self.wait()
        self._thread = threading.Thread(
            target=self._background, args=(step, snap, meta), name="slurm-preempt-save", daemon=True
        )
        self._thread.start()

    # Deprecated aliases, kept for one release: each warns and takes the one path above.

    def save_torch(
        self, step: int, state: Any, meta: Mapping | None = None, background: bool = False
    ) -> Checkpoint | None:
        """Deprecated: ``CheckpointStore(..., format=TorchFormat()).save(step, state, background=...)``."""
        _deprecated("save_torch()", "CheckpointStore(..., format=TorchFormat()).save(step, state)")
        from slurm_preempt.job.formats import TorchFormat

        return self._save(int(step), state, meta, background, TorchFormat())

    def save_async(self, step: int, payload: Any, meta: Mapping | None = None) -> None:
        """Deprecated: ``save(step, payload, background=True)``."""
        _deprecated("save_async()", "save(step, payload, background=True)")
        self._save(int(step), payload, meta, True, PickleFormat())

    def save_snapshot_async(self, step: int, snap: Snapshot, meta: dict) -> None:
        """Deprecated (internal): ``save(step, payload, background=True)``."""
        _deprecated("save_snapshot_async()", "save(step, payload, background=True)")
        self._start_background(int(step), snap, meta)

    def wait(self) -> Checkpoint | None:
        """Wait for the save in flight; raise CheckpointError if it (or the previous one) failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointError):
                raise CheckpointError(f"background save failed: {error}") from error
            raise CheckpointError(f"background save failed: {error!r}") from error
        return self._last

    def settle(self) -> Checkpoint | None:
        """``wait()``, then wait for the pruning of older checkpoints too."""
        last = self.wait()
        if self._tidy is not None:
            self._tidy.join()
            self._tidy = None
        return last

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _background(self, step: int, snap: Snapshot, meta: dict) -> None:
        try:
            self._write(step, snap, meta)
        except BaseException as exc:  # surfaces on the next call, never silently
            self._error = exc

    def _write(self, step: int, snap: Snapshot, meta: dict) -> Checkpoint:
        started = time.monotonic()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            scratch = commit.Scratch(self.directory, self.owner)
        except OSError as exc:
            raise CheckpointError(self._failure_text(step, exc)) from exc
        if not self._swept:  # leftovers of a killed attempt (any host) may hold the space we need
            self._swept = True
            self._housekeep(scratch.started, prune=False)
        self._warn_if_older(step)
        scratch.start_heartbeat()
        try:
            files = self._write_files(scratch.path, snap)
            manifest = {
                "version": FORMAT_VERSION,
                "step": step,
                "kind": snap.kind,
                "created": time.time(),
                "checksum": checksum.DEFAULT,
                "files": files,
                "meta": meta,
                **snap.extra,
            }
            write_file(scratch.path / MANIFEST, [json.dumps(manifest, indent=1).encode()])
            final = scratch.commit(step)
        except OSError as exc:
            scratch.abort()
            raise CheckpointError(self._failure_text(step, exc)) from exc
        except BaseException:
            scratch.abort()
            raise
        manifest["seconds"] = round(time.monotonic() - started, 6)
        self._last = Checkpoint(step, final, manifest)
        self._start_housekeeping(scratch.started)
        return self._last

    def _write_files(self, folder: Path, snap: Snapshot) -> dict[str, dict]:
        files = {}
        names = [*snap.files, *snap.streams, *snap.copies]
        subfolders = {folder / parent for name in names for parent in Path(name).parents} - {folder}
        for sub in sorted(subfolders, key=lambda p: len(p.parts)):
            fs_step("mkdir")
            sub.mkdir(exist_ok=True)
        for name, pieces in snap.files.items():
            files[name] = write_file(folder / name, pieces)
        for name, produce in snap.streams.items():
            files[name] = stream_file(folder / name, produce)
        for name, source in snap.copies.items():
            files[name] = copy_file(source, folder / name)
        for sub in sorted(subfolders, key=lambda p: -len(p.parts)):
            fs_step("fsync subfolder")
            fsync_dir(sub)
        return files

    def _warn_if_older(self, step: int) -> None:
        newest = self._newest_step()
        if newest is not None and step < newest:
            self._warn(
                f"saving step {step} in {self.directory}, which holds step {newest}: the newest step "
                "wins on restore, so this one is pruned or ignored (use a new folder for a fresh run)"
            )

    def _start_housekeeping(self, now: float) -> None:
        """Prune and sweep on a helper thread once the new checkpoint is durable. Not a daemon: a
        program that exits right after a save still finishes deleting what it started to delete."""
        if self._tidy is not None:
            self._tidy.join()
        self._tidy = threading.Thread(target=self._housekeep, args=(now,), name="slurm-preempt-prune")
        self._tidy.start()

    def _housekeep(self, now: float, prune: bool = True) -> None:
        try:
            if prune:
                commit.prune(self.directory, self.keep, self.owner)
            commit.sweep(self.directory, self.owner, now=now)
        except OSError as exc:
            self._warn(f"cannot delete old checkpoints or leftovers in {self.directory}: {exc}")

    def _failure_text(self, step: int, exc: OSError) -> str:
        previous = self._newest_name()
        kept = f"; {previous} is intact" if previous else ""
        what = "disk full" if exc.errno == 28 else (exc.strerror or str(exc))
        return f"cannot save checkpoint step {step} in {self.directory}: {what}{kept}"

    def _newest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def _newest_name(self) -> str | None:
        entries = commit.committed(self.directory)
        return entries[-1][2] if entries else None

    # ------------------------------------------------------------------------------------ loading

    def steps(self) -> list[int]:
        """Steps of the complete-looking checkpoints, oldest first (not verified)."""
        return sorted({step for step, _gen, _name in commit.committed(self.directory)})

    def open(self, step: int) -> Checkpoint | None:
        """Checkpoint ``step`` (its newest generation) with its manifest read (not verified), or None."""
        name = commit.newest_generations(self.directory).get(int(step))
        return None if name is None else self._open_name(name, int(step))

    def _open_name(self, name: str, step: int) -> Checkpoint | None:
        path = self.directory / name
        try:
            manifest = json.loads((path / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or manifest.get("step") != step:
            return None
        return Checkpoint(step, path, manifest)

    def _candidates(self) -> list[tuple[str, int]]:
        """Every folder that may hold a checkpoint, best first: newest step, newest generation, then
        a folder an older version renamed aside during a re-save that never finished."""
        found = [(step, gen, name) for step, gen, name in commit.committed(self.directory)]
        found += [(step, -1, name) for step, name in commit.legacy_asides(self.directory)]
        return [(name, step) for step, _gen, name in sorted(found, reverse=True)]

    def latest(self, verify: bool = True) -> Checkpoint | None:
        """The newest intact checkpoint; damaged newer ones are skipped with a warning. None: none yet."""
        found = self._first_intact(_verify if verify else (lambda _found: None))
        return None if found is None else replace(found[0], verified=verify)

    def restore(self, writable: bool = False) -> tuple[Checkpoint, Any] | None:
        """(checkpoint, payload) of the newest intact checkpoint, or None on a first run; damaged newer
        ones are skipped with a warning. Checked while loaded: each file is read from the disk once.
        Bytes and arrays come back as read-only views of the files, not copies; ``writable``: copies."""
        found = self._first_intact(lambda checkpoint: checkpoint.load_checked(writable=writable))
        return None if found is None else (replace(found[0], verified=True), found[1])

    def load_latest(self) -> tuple[int, Any] | None:
        """Deprecated: ``restore()``, which returns the Checkpoint where this returned its step."""
        _deprecated("load_latest()", "restore()")
        found = self.restore()
        return None if found is None else (found[0].step, found[1])

    def _first_intact(self, check: Callable[[Checkpoint], Any]) -> tuple[Checkpoint, Any] | None:
        """The first candidate that opens and passes ``check`` (which raises Damaged), and what
        ``check`` returned; damaged ones are skipped with a warning."""
        warned: set[str] = set()
        for _ in range(3):  # a folder vanishing while we read: a newer one arrived, or it was pruned
            vanished = False
            for name, step in self._candidates():
                found = self._open_name(name, step)
                try:
                    if found is None:
                        raise Damaged("no readable manifest")
                    return found, check(found)
                except Damaged as exc:
                    problem = str(exc)
                if not (self.directory / name).exists():
                    vanished = True
                    break
                if name not in warned:
                    warned.add(name)
                    where = self.directory / name
                    self._warn(f"checkpoint {where} is damaged ({problem}); trying an older one")
            if not vanished:
                return None
        return None


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"CheckpointStore.{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def _verify(found: Checkpoint) -> None:
    problem = found.verify()
    if problem is not None:
        raise Damaged(problem)


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (also when it belongs to another user)."""
    return commit.process_running(pid)
