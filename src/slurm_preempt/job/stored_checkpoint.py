"""One complete checkpoint on disk: its manifest, whether it is still intact, its payload.

Made by the store (``checkpoint.py``) when a save commits or when a restore opens a folder. Loading
reads every file from the disk once and, unless the store just did, checks it against the manifest's
sizes and checksums as it reads (``checkpoint_io.py``). Nothing is copied: bytes and the buffers of
pickled arrays come back as read-only views of the mapped files, torch state as tensors over a mapping
(``torch.load(mmap=True)``), each file under a read lease so that another process truncating it can
never kill this one (``mapguard.py``); ``writable=True`` asks for writable copies instead. The manifest
names the checkpoint's kind, so loading needs no format: ``bytes`` (``data.bin``), ``files``
(``{name: bytes}``), ``pickle`` (protocol 5, buffers from ``state.buffers``), ``torch`` (imports
torch), ``paths`` and ``sharded`` (the folder itself). Import-light: standard library only.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.checkpoint_io import Damaged, read_view, verify_file
from slurm_preempt.job.snapshot import BUFFERS_FILE, BYTES_FILE, PICKLE_FILE


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint on disk (``verify()`` says whether it is still intact)."""

    step: int
    path: Path
    manifest: dict
    verified: bool = field(default=False, compare=False)  # checked just now: load() need not again

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
                verify_file(self.path / name, want)
            except Damaged as exc:
                return str(exc)
        return None

    def read_bytes(self, name: str = BYTES_FILE) -> bytes:
        return (self.path / name).read_bytes()

    def load(self, writable: bool = False) -> Any:
        """The saved payload: bytes, a dict of name -> bytes, an object, or a folder (for paths).
        Verified as it is read unless ``latest()`` just verified it. Bytes and arrays are read-only
        views of the mapped files (no copy); ``writable``: writable copies (bytearray, arrays)."""
        try:
            return self.load_checked(check=not self.verified, writable=writable)
        except Damaged as exc:
            raise CheckpointError(f"checkpoint {self.path} is damaged ({exc})") from exc

    def load_checked(self, check: bool = True, writable: bool = False) -> Any:
        """``load()``, raising Damaged when ``check`` finds a file that differs from the manifest.
        Every file is read from the disk once: mapped, then checksummed over the mapped pages."""
        files = self.manifest.get("files")
        if not isinstance(files, dict) or not files:
            raise Damaged("manifest lists no files")
        if self.kind in ("bytes", "files"):

            def read(name: str) -> Any:
                return read_view(self.path / name, files[name], check, writable)

            if self.kind == "bytes":
                return read(BYTES_FILE)
            return {name: read(name) for name in files}
        if self.kind == "pickle":
            return self._load_pickle(files, check, writable)
        if self.kind == "torch":
            from slurm_preempt.job import torchstate  # imports torch: only for TorchFormat checkpoints

            return torchstate.load(
                self.path / torchstate.FILE, files.get(torchstate.FILE, {}) if check else None
            )
        if check:
            for name, want in files.items():
                verify_file(self.path / name, want)
        return self.path

    def _load_pickle(self, files: dict, check: bool, writable: bool) -> Any:
        head = read_view(self.path / PICKLE_FILE, files.get(PICKLE_FILE), check)
        blob = memoryview(read_view(self.path / BUFFERS_FILE, files.get(BUFFERS_FILE), check, writable))
        buffers, offset = [], 0
        for length in self.manifest.get("buffers", []):
            buffers.append(blob[offset : offset + length])
            offset += length
        return pickle_loads(head, buffers)


def pickle_loads(head: bytes, buffers: list) -> Any:
    return pickle.loads(head, buffers=buffers)
