"""The checkpoint data path: durable writes and verified reads that touch each byte once.

Writing (``DurableWriter``): bytes go from the caller's memory to the file (no copy of the payload);
for every large write, CRC-32 runs on a helper thread over the same memory while the calling thread
writes it (``zlib.crc32`` and ``os.write`` both release the GIL); writeback of each written chunk is
started at once (``sync_file_range(SYNC_FILE_RANGE_WRITE)`` on Linux), so the disk works while later
chunks are still being copied into the page cache and the final ``fsync`` waits only for the tail.
Without that kick the kernel holds the whole file dirty until ``fsync`` (dirty_background_ratio is
far above a checkpoint's size on a large-memory node) and the copy and the disk run one after the other.

Reading: ``checksum_path`` streams a file through a few reused buffers, CRC-32 of one running on a
helper thread while the next is read; nothing is deserialised before every file matched the manifest.
``map_file`` then maps the file privately (copy-on-write): its pages are already in the page cache, so
the disk is read once, and arrays or tensors restored over the mapping are writable without a copy.

``fs_step`` marks the boundary before every filesystem step of a save, a commit and a prune: tests set
``step_hook`` to kill the process at each boundary in turn. Standard library only.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


def _checksum_entry(size: int, crc: int) -> dict:
    return {"bytes": size, "crc32": f"{crc:08x}"}


class DurableWriter:
    """A new file (never an existing one), written through: CRC-32 while writing, writeback started per
    chunk, ``finish()`` fsyncs and returns {bytes, crc32}. File-like enough for ``torch.save``."""

    def __init__(self, path: Path):
        fs_step(f"create {path.name}")
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.size = 0
        self._crc = 0
        self._kicked = 0  # bytes whose writeback was started
        self._sums: _Crc | None = None  # the helper thread, from the first large write on
        self._start_writeback = _writeback()

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def write(self, data: Any, stable: bool = False) -> int:
        """Write ``data``; its CRC-32 runs on the helper thread meanwhile. ``stable``: the caller keeps
        this memory unchanged until ``finish()``, so the checksum may lag behind (a snapshot's pieces);
        otherwise write() returns only once the checksum has read it (torch.save hands out views of
        buffers it frees right after)."""
        view = _bytes_view(data)
        if self._sums is None and len(view) < OVERLAP_MIN:
            self._crc = zlib.crc32(view, self._crc)
            self._write_all(view)
            return len(view)
        if self._sums is None:
            self._sums = _Crc(self._crc)
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
        return _checksum_entry(self.size, self._crc)

    def abort(self) -> None:
        if self._sums is not None:
            self._crc = self._sums.close()
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


class _Crc:
    """CRC-32 of a stream, computed in order on one helper thread while the caller does the I/O."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurm-preempt-crc")

    def submit(self, view: memoryview) -> Future:
        return self._pool.submit(self._add, view)

    def _add(self, view: memoryview) -> None:
        self.value = zlib.crc32(view, self.value)

    def close(self) -> int:
        self._pool.shutdown(wait=True)
        return self.value


READ_SLOTS = 3  # buffers in flight while checksumming a file: one being read, the others being summed


def checksum_path(path: Path) -> tuple[int, str]:
    """(size, crc32 hex) of a file, read once through a few reused buffers, the checksum of one running
    while the next is read. The file's pages stay cached for the ``map_file`` that follows."""
    with open(path, "rb", buffering=0) as handle:
        _sequential(handle.fileno())
        if os.fstat(handle.fileno()).st_size < OVERLAP_MIN:
            data = handle.read()
            return len(data), f"{zlib.crc32(data):08x}"
        crc, size = _Crc(), 0
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
                pending[slot] = crc.submit(memoryview(slots[slot])[:count])
                size += count
        finally:
            value = crc.close()
    return size, f"{value:08x}"


def _checksum_mapped(path: Path) -> tuple[int, str]:
    """(size, crc32 hex) of a file through a read-only mapping of its cached pages: no copy."""
    with open(path, "rb", buffering=0) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return 0, f"{zlib.crc32(b''):08x}"
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
            if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                mapping.madvise(mmap.MADV_SEQUENTIAL)
            view, crc = memoryview(mapping), 0
            try:
                for start in range(0, size, CHUNK):
                    crc = zlib.crc32(view[start : start + CHUNK], crc)
            finally:
                view.release()
    return size, f"{crc:08x}"


def verify_file(path: Path, want: object) -> None:
    """Raise Damaged unless ``path`` has the size and CRC-32 of its manifest entry {bytes, crc32}."""
    if not isinstance(want, dict):
        raise Damaged(f"{path.name}: no manifest entry")
    try:
        if os.stat(path).st_size != want.get("bytes"):
            raise Damaged(f"{path.name}: size differs from the manifest")
        size, crc = checksum_path(path)
    except OSError as exc:
        raise Damaged(f"{path.name}: {exc.strerror or exc}") from exc
    if size != want.get("bytes") or crc != want.get("crc32"):
        raise Damaged(f"{path.name}: size or checksum differs from the manifest")


def map_file(path: Path) -> Any:
    """The file's bytes as a private writable mapping (copy-on-write: writes never reach the file), or
    b"" when it is empty. After ``checksum_path`` its pages are in the page cache: nothing is read twice."""
    with open(path, "rb", buffering=0) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return b""
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)


def read_checked(path: Path, want: object) -> bytes:
    """The file's bytes, checked against its manifest entry. A helper thread checksums the file through
    a mapping while this one reads it: the disk is read once (whichever comes first brings a page into
    the cache), the helper copies nothing, and the checksum takes no time of its own where checking
    first and reading after made a second pass (bench/bench_checkpoint.py, "load bytes")."""
    if not isinstance(want, dict):
        raise Damaged(f"{path.name}: no manifest entry")
    found: dict[str, Any] = {}

    def check() -> None:
        try:
            found["sum"] = _checksum_mapped(path)
        except (OSError, ValueError) as exc:
            found["error"] = exc

    helper = threading.Thread(target=check, name="slurm-preempt-crc", daemon=True)
    helper.start()
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise Damaged(f"{path.name}: {exc.strerror or exc}") from exc
    finally:
        helper.join()
    size, crc = found.get("sum", (None, None))
    if len(data) != want.get("bytes") or size != len(data) or crc != want.get("crc32"):
        raise Damaged(f"{path.name}: size or checksum differs from the manifest")
    return data


def _sequential(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
