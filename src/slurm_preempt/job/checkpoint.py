"""The checkpoint store: a checkpoint is complete or invisible.

Layout of a store folder::

    <dir>/step-000000000042/          one complete checkpoint
            state.pkl  state.buffers  (or data.bin, or the files you saved)
            MANIFEST.json             written last: step, sizes, CRC-32 of every file, metadata
    <dir>/.tmp-<host>-<pid>-<step>-.../  a save in progress (never read; swept once its process died)

A save writes every file under the temporary folder, fsyncs each file, writes the manifest last,
fsyncs the folder, renames it to ``step-N`` and fsyncs the store folder. A process killed at any point
leaves either the previous checkpoints or the new one, never a torn one. Loading verifies the manifest
(sizes and checksums) and falls back to the previous good checkpoint with a warning.

Checksum: zlib.crc32, chosen by measurement on this host (256 MiB in memory): crc32 2.9 GB/s, adler32
2.1, sha256 1.2, blake2b 0.5 GB/s; xxh3 (PyPI) 12 GB/s but not worth a dependency while crc32 runs
faster than the fsynced disk. It detects damage, not tampering. Import-light: standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_preempt.durable import checksum_file, copy_durably, fsync_dir, write_durably
from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.snapshot import (
    BUFFERS_FILE,
    BYTES_FILE,
    MANIFEST,
    PICKLE_FILE,
    Snapshot,
    snapshot_of,
    snapshot_of_paths,
)

log = logging.getLogger(__name__)

PREFIX = "step-"
FORMAT_VERSION = 1
DEFAULT_KEEP = 3


def step_name(step: int) -> str:
    return f"{PREFIX}{int(step):012d}"


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint on disk (``verify()`` says whether it is still intact)."""

    step: int
    path: Path
    manifest: dict

    @property
    def meta(self) -> dict:
        return self.manifest.get("meta", {})

    @property
    def kind(self) -> str:
        return self.manifest.get("kind", "bytes")

    @property
    def nbytes(self) -> int:
        return sum(f["bytes"] for f in self.manifest["files"].values())

    def verify(self) -> str | None:
        """None when every file has its recorded size and checksum, else what is wrong."""
        files = self.manifest.get("files")
        if not isinstance(files, dict) or not files:
            return "manifest lists no files"
        for name, want in files.items():
            try:
                size, crc = checksum_file(self.path / name)
            except OSError as exc:
                return f"{name}: {exc.strerror}"
            if size != want.get("bytes") or crc != want.get("crc32"):
                return f"{name}: size or checksum differs from the manifest"
        return None

    def read_bytes(self, name: str = BYTES_FILE) -> bytes:
        return (self.path / name).read_bytes()

    def load(self) -> Any:
        """The saved payload: bytes, a dict of name -> bytes, an object, or a folder (for paths)."""
        if self.kind == "bytes":
            return self.read_bytes()
        if self.kind == "files":
            return {name: self.read_bytes(name) for name in self.manifest["files"]}
        if self.kind == "pickle":
            return self._load_pickle()
        if self.kind == "torch":
            from slurm_preempt.job import (
                torchstate,  # imports torch: only for checkpoints saved with save_torch
            )

            return torchstate.load(self.path / torchstate.FILE)
        return self.path

    def _load_pickle(self) -> Any:
        blob = memoryview(self.read_bytes(BUFFERS_FILE))
        buffers, offset = [], 0
        for length in self.manifest.get("buffers", []):
            buffers.append(blob[offset : offset + length])
            offset += length
        return pickle.loads(self.read_bytes(PICKLE_FILE), buffers=buffers)


class CheckpointStore:
    """Atomic checkpoints in one folder; keeps the last ``keep``; background saves optional.

    ``warn`` receives each warning (a damaged checkpoint skipped, an older step saved); by default it
    is logged (``slurm_preempt.job.checkpoint``, level WARNING).
    """

    def __init__(
        self, directory: Path | str, keep: int = DEFAULT_KEEP, warn: Callable[[str], None] | None = None
    ):
        if keep < 1:
            raise CheckpointError(f"keep must be at least 1, not {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self._warn = warn if warn is not None else log.warning
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last: Checkpoint | None = None

    # ------------------------------------------------------------------------------------ saving

    def save(self, step: int, payload: Any, meta: Mapping | None = None) -> Checkpoint:
        """Write ``payload`` as checkpoint ``step`` and return it once it is durable."""
        self.wait()
        return self._write(int(step), snapshot_of(payload), dict(meta or {}))

    def save_paths(self, step: int, paths: Iterable[Path | str], meta: Mapping | None = None) -> Checkpoint:
        self.wait()
        return self._write(int(step), snapshot_of_paths(paths), dict(meta or {}))

    def save_torch(self, step: int, state: Any, meta: Mapping | None = None, background=False):
        """Save a PyTorch state dict (tensors anywhere in nested dicts/lists; copied to CPU first, the
        only stall when ``background``). Needs torch (the ``[torch]`` extra)."""
        from slurm_preempt.job import torchstate

        self.wait()
        snap = torchstate.snapshot(state)
        if background:
            return self.save_snapshot_async(int(step), snap, dict(meta or {}))
        return self._write(int(step), snap, dict(meta or {}))

    def save_async(self, step: int, payload: Any, meta: Mapping | None = None) -> None:
        """Snapshot ``payload`` now, write it in a background thread. One save in flight: this waits for
        the previous one, and raises its error if it failed."""
        self.wait()
        snap = snapshot_of(payload)
        self.save_snapshot_async(int(step), snap, dict(meta or {}))

    def save_snapshot_async(self, step: int, snap: Snapshot, meta: dict) -> None:
        self.wait()
        self._thread = threading.Thread(
            target=self._background, args=(step, snap, meta), name="slurm-preempt-save", daemon=True
        )
        self._thread.start()

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
        self.directory.mkdir(parents=True, exist_ok=True)
        self._sweep()
        newest = self._newest_step()
        if newest is not None and step < newest:
            self._warn(
                f"saving step {step} in {self.directory}, which holds step {newest}: the newest step "
                "wins on restore, so this one is pruned or ignored (use a new folder for a fresh run)"
            )
        tmp = self._scratch("tmp", f"{step}-{threading.get_ident()}")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            files = self._write_files(tmp, snap)
            manifest = {
                "version": FORMAT_VERSION,
                "step": step,
                "kind": snap.kind,
                "created": time.time(),
                "checksum": "crc32",
                "files": files,
                "meta": meta,
                **snap.extra,
            }
            write_durably(tmp / MANIFEST, [json.dumps(manifest, indent=1).encode()])
            fsync_dir(tmp)
            final = self.directory / step_name(step)
            self._replace(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(self._failure_text(step, exc)) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        manifest["seconds"] = round(time.monotonic() - started, 6)
        self._last = Checkpoint(step, final, manifest)
        self._prune()
        return self._last

    def _write_files(self, folder: Path, snap: Snapshot) -> dict[str, dict]:
        files = {}
        if snap.lazy is not None:
            snap.files.update(snap.lazy())
        for name, data in snap.files.items():
            pieces = data if isinstance(data, list) else [data]
            files[name] = write_durably(folder / name, pieces)
        for name, source in snap.copies.items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            files[name] = copy_durably(source, target)
        subfolders = {folder / parent for n in snap.copies for parent in Path(n).parents} - {folder}
        for sub in sorted(subfolders, key=lambda p: -len(p.parts)):
            fsync_dir(sub)
        return files

    def _replace(self, tmp: Path, final: Path) -> None:
        if final.exists():
            # Re-saving a step (e.g. the final checkpoint of a resumed run at the same step): move the old
            # one aside first; a crash in between leaves the earlier checkpoints to fall back to.
            aside = self._scratch("old", final.name)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
            os.rename(tmp, final)
            fsync_dir(self.directory)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(tmp, final)
            fsync_dir(self.directory)

    def _scratch(self, kind: str, what: str) -> Path:
        return self.directory / f".{kind}-{_HOST}-{os.getpid()}-{what}"

    def _sweep(self) -> None:
        """Remove scratch folders left by processes of this host that died (killed mid-save)."""
        try:
            names = [n for n in os.listdir(self.directory) if n.startswith((".tmp-", ".old-", ".del-"))]
        except OSError:
            return
        for name in names:
            parts = name.split("-", 3)
            if len(parts) < 4 or parts[1] != _HOST or not parts[2].isdigit() or pid_alive(int(parts[2])):
                continue
            target = self.directory / parts[3]
            if name.startswith(".old-") and not target.exists():
                os.rename(self.directory / name, target)  # killed between the two renames of a re-save
                continue
            shutil.rmtree(self.directory / name, ignore_errors=True)

    def _failure_text(self, step: int, exc: OSError) -> str:
        previous = self._newest_name()
        kept = f"; {previous} is intact" if previous else ""
        what = "disk full" if exc.errno == 28 else (exc.strerror or str(exc))
        return f"cannot save checkpoint step {step} in {self.directory}: {what}{kept}"

    def _newest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def _newest_name(self) -> str | None:
        newest = self._newest_step()
        return None if newest is None else step_name(newest)

    def _prune(self) -> None:
        for step in self.steps()[: -self.keep]:
            path = self.directory / step_name(step)
            trash = self._scratch("del", path.name)
            try:
                os.rename(path, trash)  # gone from listings at once, even if rmtree is interrupted
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)

    # ------------------------------------------------------------------------------------ loading

    def steps(self) -> list[int]:
        """Steps of the complete-looking checkpoints, oldest first (not verified)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(
            int(n[len(PREFIX) :]) for n in names if n.startswith(PREFIX) and n[len(PREFIX) :].isdigit()
        )

    def open(self, step: int) -> Checkpoint | None:
        """Checkpoint ``step`` with its manifest read (not verified), or None if it has none."""
        path = self.directory / step_name(step)
        try:
            manifest = json.loads((path / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(manifest, dict) or manifest.get("step") != step:
            return None
        return Checkpoint(step, path, manifest)

    def latest(self, verify: bool = True) -> Checkpoint | None:
        """The newest intact checkpoint; damaged newer ones are skipped with a warning. None: none yet."""
        for step in reversed(self.steps()):
            found = self.open(step)
            problem = "no readable manifest" if found is None else (found.verify() if verify else None)
            if problem is None:
                return found
            self._warn(
                f"checkpoint {self.directory / step_name(step)} is damaged ({problem}); trying an older one"
            )
        return None

    def load_latest(self) -> tuple[int, Any] | None:
        """(step, payload) of the newest intact checkpoint, or None on a first run."""
        found = self.latest()
        return None if found is None else (found.step, found.load())


_HOST = socket.gethostname().split(".")[0].replace("-", "_")


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (also when it belongs to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
