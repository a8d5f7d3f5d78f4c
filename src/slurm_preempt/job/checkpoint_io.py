"""The checkpoint data path: durable writes and verified reads that touch each byte once.

Writing (``DurableWriter``): bytes go from the caller's memory to the file (no copy of the payload);
for every large write, the checksum (``checksum.py``: XXH3 by default) runs on a helper thread over the
same memory while the calling thread writes it (the checksum and ``os.write`` both release the GIL);
writeback of each written chunk is started at once (``sync_file_range(SYNC_FILE_RANGE_WRITE)`` on
Linux), so the disk works while later chunks are still being copied into the page cache and the final
``fsync`` waits only for the tail. Without that kick the kernel holds the whole file dirty until
``fsync`` (dirty_background_ratio is far above a checkpoint's size on a large-memory node) and the copy
and the disk run one after the other.

Reading: ``read_view`` maps the file under a read lease (``mapguard.py``: truncation by another process
can never SIGBUS us) and checksums the mapped pages in place: the bytes come back as a read-only view
of the page cache, never copied (a writable copy on request). ``verify_file`` and ``file_entry``
stream a file through a few reused buffers, the checksum of one running on a helper thread while the
next is read; nothing is deserialised before every file matched the manifest.

``fs_step`` marks the boundary before every filesystem step of a save, a commit and a prune: tests set
``step_hook`` to kill the process at each boundary in turn. Standard library only.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from slurm_preempt.job import checksum, mapguard

CHUNK = 8 << 20  # write, kick writeback and checksum in 8 MiB pieces
OVERLAP_MIN = 1 << 20  # below this a helper thread costs more than the checksum it takes over
_SYNC_FILE_RANGE_WRITE = 2

# Kill-point injection for tests: called with a short description before each filesystem step.
step_hook: Callable[[str], None] | None = None


def fs_step(what: str) -> None:
    if step_hook is not None:
        step_hook(what)


class Damaged(Exception):
    """A file does not match its manifest entry (size or checksum), or cannot be read."""


_writeback_fn: Any = None


def _writeback() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range, or None where there is none (not Linux/glibc): then the kernel alone
    decides when to write back, and ``fsync`` does it all."""
    global _writeback_fn
    if _writeback_fn is None:
        _writeback_fn = False
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            function = libc.sync_file_range
            function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _writeback_fn = function
        except (OSError, AttributeError):
            pass
    return _writeback_fn or None


def _bytes_view(data: Any) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class DurableWriter:
    """A new file (never an existing one), written through: checksummed while writing, writeback
    started per chunk, ``finish()`` fsyncs and returns its manifest entry. File-like enough for
    ``torch.save``."""

    def __init__(self, path: Path):
        fs_step(f"create {path.name}")
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.size = 0
        self._running = checksum.Running()
        self._kicked = 0  # bytes whose writeback was started
        self._sums: _Summer | None = None  # the helper thread, from the first large write on
        self._start_writeback = _writeback()

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def write(self, data: Any, stable: bool = False) -> int:
        """Write ``data``; its checksum runs on the helper thread meanwhile. ``stable``: the caller keeps
        this memory unchanged until ``finish()``, so the checksum may lag behind (a snapshot's pieces);
        otherwise write() returns only once the checksum has read it (torch.save hands out views of
        buffers it frees right after)."""
        view = _bytes_view(data)
        if self._sums is None and len(view) < OVERLAP_MIN:
            self._running.update(view)
            self._write_all(view)
            return len(view)
        if self._sums is None:
            self._sums = _Summer(self._running)
        pending = self._sums.submit(view)
        try:
            self._write_all(view)
        finally:
            if not stable:
                pending.result()  # even on error: the caller may free this memory once we return
        return len(view)

    def write_pieces(self, pieces: Iterable[Any]) -> None:
        """Write pieces that stay unchanged until ``finish()``: no wait for the checksum between them."""
        for piece in pieces:
            self.write(piece, stable=True)

    def _write_all(self, view: memoryview) -> None:
        for start in range(0, len(view), CHUNK):
            part = view[start : start + CHUNK]
            fs_step(f"write {self.path.name}")
            while part:
                written = os.write(self._fd, part)
                part = part[written:]
                self.size += written
            unkicked = self.size - self._kicked
            if self._start_writeback is not None and unkicked >= CHUNK:
                self._start_writeback(self._fd, self._kicked, unkicked, _SYNC_FILE_RANGE_WRITE)
                self._kicked = self.size

    def finish(self) -> dict:
        """fsync and close; the file's manifest entry."""
        try:
            fs_step(f"fsync {self.path.name}")
            os.fsync(self._fd)
        finally:
            self.abort()
        return checksum.entry(self.size, self._running)

    def abort(self) -> None:
        if self._sums is not None:
            self._sums.close()
            self._sums = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_file(path: Path, pieces: Iterable[Any]) -> dict:
    """Write ``pieces`` (bytes-like, written from where they are) to the new file ``path``, durably."""
    writer = DurableWriter(path)
    try:
        writer.write_pieces(pieces)
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def stream_file(path: Path, produce: Callable[[DurableWriter], None]) -> dict:
    """Let ``produce`` write into the new file ``path`` (e.g. ``torch.save(obj, writer)``), durably."""
    writer = DurableWriter(path)
    try:
        produce(writer)
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def copy_file(source: Path, target: Path) -> dict:
    """Copy ``source`` into the new file ``target`` durably, checksumming what was written."""
    writer = DurableWriter(target)
    try:
        with open(source, "rb", buffering=0) as handle:
            buffer = bytearray(CHUNK)
            view = memoryview(buffer)
            while count := handle.readinto(buffer):
                writer.write(view[:count])
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


class _Summer:
    """A running checksum fed in order on one helper thread while the caller does the I/O (xxh3 and
    zlib's CRC-32 both release the GIL)."""

    def __init__(self, running: checksum.Running) -> None:
        self._running = running
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurm-preempt-sum")

    def submit(self, view: memoryview) -> Future:
        return self._pool.submit(self._running.update, view)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


READ_SLOTS = 3  # buffers in flight while checksumming a file: one being read, the others being summed


def file_entry(path: Path, name: str = checksum.DEFAULT) -> dict:
    """The manifest entry {bytes, NAME: hex} of a file, read once through a few reused buffers, the
    checksum of one running while the next is read. The file's pages stay cached for a map that follows."""
    with open(path, "rb", buffering=0) as handle:
        return _entry_of_open(handle, checksum.Running(name))


def _entry_of_open(handle: Any, running: checksum.Running) -> dict:
    _sequential(handle.fileno())
    if os.fstat(handle.fileno()).st_size < OVERLAP_MIN:
        data = handle.read()
        running.update(data)
        return checksum.entry(len(data), running)
    sums, size = _Summer(running), 0
    slots = [bytearray(CHUNK) for _ in range(READ_SLOTS)]
    pending: list[Future | None] = [None] * READ_SLOTS
    try:
        for turn in itertools.count():
            slot = turn % READ_SLOTS
            if pending[slot] is not None:
                pending[slot].result()  # type: ignore[union-attr]
            count = handle.readinto(slots[slot])
            if not count:
                break
            pending[slot] = sums.submit(memoryview(slots[slot])[:count])
            size += count
    finally:
        sums.close()
    return checksum.entry(size, running)


def _wanted(path: Path, want: object) -> tuple[dict, str]:
    """The manifest entry and the name of its checksum."""
    if not isinstance(want, dict):
        raise Damaged(f"{path.name}: no manifest entry")
    try:
        return want, checksum.name_of(want)
    except checksum.UnknownChecksum as exc:
        raise Damaged(f"{path.name}: {exc}") from exc


def verify_file(path: Path, want: object) -> None:
    """Raise Damaged unless ``path`` has the size and checksum of its manifest entry."""
    entry, name = _wanted(path, want)
    try:
        if os.stat(path).st_size != entry.get("bytes"):
            raise Damaged(f"{path.name}: size differs from the manifest")
        found = file_entry(path, name)
    except (OSError, checksum.UnknownChecksum) as exc:
        raise Damaged(f"{path.name}: {getattr(exc, 'strerror', None) or exc}") from exc
    if found != {"bytes": entry.get("bytes"), name: entry.get(name)}:
        raise Damaged(f"{path.name}: size or checksum differs from the manifest")


def read_view(path: Path, want: object, check: bool = True, writable: bool = False) -> Any:
    """The file's bytes without a copy: a read-only view over its cached pages that another process
    cannot pull away (``mapguard``), checked against its manifest entry when ``check`` (one pass over
    those pages, no copy). ``writable``: a writable copy instead."""
    entry, name = _wanted(path, want) if check else ({}, checksum.DEFAULT)
    try:
        data = mapguard.view(path, writable)
        if check:
            running, view = checksum.Running(name), memoryview(data)
            for start in range(0, len(view), CHUNK):
                running.update(view[start : start + CHUNK])
            if not checksum.matches(entry, len(view), running):
                raise Damaged(f"{path.name}: size or checksum differs from the manifest")
    except (OSError, ValueError) as exc:
        raise Damaged(f"{path.name}: {getattr(exc, 'strerror', None) or exc}") from exc
    return data


def _sequential(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
