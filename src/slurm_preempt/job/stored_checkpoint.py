"""One complete checkpoint on disk: its manifest, whether it is still intact, its payload.

Made by the store (``checkpoint.py``) when a save commits or when a restore opens a folder. Loading
reads every file from the disk once and, unless the store just did, checks it against the manifest's
sizes and CRC-32 as it reads (``checkpoint_io.py``). The manifest names the checkpoint's kind, so
loading needs no format: ``bytes`` (``data.bin``), ``files`` (``{name: bytes}``), ``pickle`` (protocol
5, buffers mapped from ``state.buffers``), ``torch`` (``torch.load`` of a mapping; imports torch),
``paths`` and ``sharded`` (the folder itself). Import-light: standard library only.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError
from slurm_preempt.job.checkpoint_io import Damaged, map_file, read_checked, verify_file
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

    def load(self) -> Any:
        """The saved payload: bytes, a dict of name -> bytes, an object, or a folder (for paths).
        Verified as it is read unless ``latest()`` just verified it; arrays come back writable."""
        try:
            return self.load_checked(check=not self.verified)
        except Damaged as exc:
            raise CheckpointError(f"checkpoint {self.path} is damaged ({exc})") from exc

    def load_checked(self, check: bool = True) -> Any:
        """``load()``, raising Damaged when ``check`` finds a file that differs from the manifest.
        Every file is read from the disk once: bytes while a helper checksums them, other kinds by
        checksumming first and then mapping the pages that brought into the page cache."""
        files = self.manifest.get("files")
        if not isinstance(files, dict) or not files:
            raise Damaged("manifest lists no files")
        if self.kind in ("bytes", "files"):
            read = (lambda n: read_checked(self.path / n, files[n])) if check else self.read_bytes
            if self.kind == "bytes":
                return read(BYTES_FILE)
            return {name: read(name) for name in files}
        if check:
            for name, want in files.items():
                verify_file(self.path / name, want)
        if self.kind == "pickle":
            return self._load_pickle()
        if self.kind == "torch":
            from slurm_preempt.job import torchstate  # imports torch: only for TorchFormat checkpoints

            return torchstate.load(self.path / torchstate.FILE)
        return self.path

    def _load_pickle(self) -> Any:
        blob = memoryview(map_file(self.path / BUFFERS_FILE))
        buffers, offset = [], 0
        for length in self.manifest.get("buffers", []):
            buffers.append(blob[offset : offset + length])
            offset += length
        return pickle_loads(self.read_bytes(PICKLE_FILE), buffers)


def pickle_loads(head: bytes, buffers: list) -> Any:
    return pickle.loads(head, buffers=buffers)
