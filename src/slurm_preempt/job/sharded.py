"""Sharded checkpoints: every rank writes its part, one commit makes all parts visible at once.

A sharded checkpoint is one folder of the checkpoint store, so restore, fallback, ``keep`` and
``slurm-preempt resume latest`` treat it like any other::

    step-000000000100/
        MANIFEST.json       written last, by rank 0, once every rank has said its part is durable:
                            kind "sharded", the world size, sizes and checksums of every file of every rank
        shard-00000.json    rank 0's part: its files, sizes and checksums (written durably before agreeing)
        __0_0.distcp ...    torch.distributed.checkpoint's files (rank r writes ``__r_*``), .metadata
        rank-00001/...      or any rank's own files

Saving, on every rank, in step (``agreement`` carries each exchange):

1. rank 0 draws a name for the scratch folder and all ranks learn it (an exchange);
2. every rank writes its part into that folder, fsyncs and checksums its own files (a file is rank
   r's when its name starts ``__r_`` or ``rank-0000r/``; any other file is rank 0's) and writes
   ``shard-<rank>.json`` durably;
3. the ranks agree that every part is durable; if any rank failed, the scratch folder is dropped and
   every rank raises ``CheckpointError`` (the previous checkpoint stays the newest);
4. rank 0 writes ``MANIFEST.json`` from the parts and commits the folder through the store's own
   ``commit.Scratch`` it opened on that folder in step 2 (drop ``.owner``, fsync, rename to the next
   free generation of the step, fsync the store folder: the protocol lives in ``commit.py`` only),
   then prunes with ``commit.prune``; a last exchange tells every rank whether the commit happened.

A rank killed anywhere leaves either no new checkpoint (a scratch folder whose ``.owner`` is rank 0's,
with its heartbeat, swept by ``commit.sweep`` once that process is gone) or a complete one: the rename
happens only after every part was durable.

Restoring, on every rank, in step: each rank proposes its newest step below the last one rejected and
the ranks take the newest proposed; each rank verifies its share of that checkpoint's files (file i
of the manifest is checked by rank i mod world, so the whole checkpoint is read once) and the ranks
agree whether it is intact; then every rank loads, and the ranks agree whether every load succeeded.
Any doubt sends every rank back together to the next older checkpoint, so no rank ever resumes from a
checkpoint that another rank rejected. The world size may differ from the one that saved: DCP
reshards (``job.dcpstate``).
Import-light: standard library only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from slurm_preempt.durable import fsync_dir
from slurm_preempt.errors import CheckpointError
from slurm_preempt.job import checksum, commit
from slurm_preempt.job.agreement import Agreement
from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore
from slurm_preempt.job.checkpoint_io import Damaged, file_entry, verify_file, write_file
from slurm_preempt.job.commit import Owner, Scratch, step_name
from slurm_preempt.job.snapshot import MANIFEST, snapshot_of

log = logging.getLogger(__name__)

KIND = "sharded"
FORMAT_VERSION = 1
PART = "shard-{rank:05d}.json"
RANK_FOLDER = "rank-{rank:05d}"
# A scratch folder of the store's kind (.tmp-...): the store's sweep judges it by the .owner rank 0
# writes into it, so any later save removes it once rank 0's process can no longer finish the save.
SCRATCH_PREFIX = ".tmp-sharded_"
_DCP_FILE = re.compile(r"^__([0-9]+)_")
_RANK_FOLDER = re.compile(r"^rank-([0-9]+)/")
_BOOKKEEPING = re.compile(r"^(shard-[0-9]+\.json|MANIFEST\.json|\.owner)$")

T = TypeVar("T")
Writer = Callable[[Path], "list[str] | None"]  # writes this rank's part into the folder; its names or None


def owner_rank(name: str) -> int:
    """The rank a file of a sharded checkpoint belongs to (``name`` relative to the folder)."""
    base = Path(name).name
    for pattern, text in ((_DCP_FILE, base), (_RANK_FOLDER, name)):
        match = pattern.match(text)
        if match:
            return int(match.group(1))
    return 0


class ShardedStore:
    """Sharded checkpoints in a checkpoint store folder, written and read by all ranks in step."""

    def __init__(
        self, directory: Path | str, agreement: Agreement, keep: int = 3, owner: Owner | None = None
    ):
        self.owner = Owner.current() if owner is None else owner
        self.store = CheckpointStore(directory, keep=keep, owner=self.owner)
        self.directory = self.store.directory
        self.agreement = agreement
        self.rank, self.world = agreement.rank, agreement.world
        self._record: Scratch | None = None  # rank 0's hold on the folder being written

    # ------------------------------------------------------------------------------------ saving

    def save(self, step: int, write: Writer, meta: dict | None = None, fmt: str = "files") -> Checkpoint:
        """Write checkpoint ``step``: ``write(folder)`` writes this rank's part (and returns the names it
        wrote, or None to claim by name). Every rank must call it; every rank returns the committed
        Checkpoint or raises CheckpointError."""
        started = time.monotonic()
        folder = self._scratch(self._agreed_nonce())
        outcome = self._guard(lambda: self._write_part(folder, write))
        self._settle(outcome, folder, f"writing the parts of step {step}")
        if self._record is not None:  # rank 0 alone reads the parts, writes the manifest, commits
            record = self._record
            outcome = self._guard(lambda: self._commit(record, step, meta, fmt, started))
        else:
            outcome = None
        self._settle(outcome, folder, f"committing step {step}")
        if outcome is None:  # committed by rank 0: as the manifest says, when this rank can read it
            fallback = Checkpoint(step, self.directory / step_name(step), {"step": step, "kind": KIND})
            outcome = self.store.open(step) or fallback
        return outcome

    def _agreed_nonce(self) -> int:
        mine = int.from_bytes(os.urandom(7), "big") + 1 if self.rank == 0 else 0
        return self.agreement.agree([mine])[0]

    def _scratch(self, nonce: int) -> Path:
        folder = self.directory / f"{SCRATCH_PREFIX}{nonce:014x}"
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                commit.sweep(self.directory, self.owner)  # leftovers of saves whose writer is gone
            except OSError as exc:
                log.warning("cannot sweep leftovers in %s: %s", self.directory, exc)
        return folder

    @staticmethod
    def _guard(action: Callable[[], Any]) -> Any:
        """The action's result, or the exception it raised: returned, so that every rank reaches the
        next exchange whatever happened here."""
        try:
            return action()
        except Exception as exc:
            return exc

    def _settle(self, outcome: Any, folder: Path, what: str) -> None:
        failed_here = isinstance(outcome, Exception)
        failed = self.agreement.agree([int(failed_here)])[0]
        if not failed:
            return
        if self._record is not None:
            self._record.abort()
            self._record = None
        elif self.rank == 0:
            commit.remove_tree(folder)  # rank 0 failed before it held the folder
        if failed_here:
            raise CheckpointError(f"rank {self.rank}: {what} failed: {outcome}") from outcome
        raise CheckpointError(f"{what} failed on another rank; the previous checkpoint stays the newest")

    def _write_part(self, folder: Path, write: Writer) -> None:
        if self.rank == 0:
            # The store's scratch folder under the agreed name: its .owner and heartbeat tell any later
            # sweep whether this save can still finish.
            self._record = Scratch(self.directory, self.owner, name=folder.name)
            self._record.start_heartbeat()
        else:  # no waiting for rank 0's mkdir to show on this node
            folder.mkdir(parents=True, exist_ok=True)
        names = write(folder)
        mine = sorted(names) if names is not None else self._claimed(folder)
        files = {name: _durable_checksum(folder / name) for name in mine}
        for sub in sorted({(folder / n).parent for n in mine} - {folder}, key=lambda p: -len(p.parts)):
            fsync_dir(sub)
        part = {"rank": self.rank, "world": self.world, "files": files}
        write_file(folder / PART.format(rank=self.rank), [json.dumps(part).encode()])

    def _claimed(self, folder: Path) -> list[str]:
        names = []
        for path in folder.rglob("*"):
            name = path.relative_to(folder).as_posix()
            if path.is_file() and not _BOOKKEEPING.match(name) and owner_rank(name) == self.rank:
                names.append(name)
        return sorted(names)

    def _commit(self, record: Scratch, step: int, meta: dict | None, fmt: str, started: float) -> Checkpoint:
        folder = record.path
        files: dict[str, dict] = {}
        ranks: dict[str, list[str]] = {}
        for rank in range(self.world):
            part_name = PART.format(rank=rank)
            part = json.loads((folder / part_name).read_bytes())
            for name, entry in part["files"].items():
                if name in files:
                    raise CheckpointError(f"{name} claimed by rank {rank} and by another rank")
                files[name] = entry
            ranks[str(rank)] = sorted(part["files"])
            files[part_name] = file_entry(folder / part_name)
        manifest = {
            "version": FORMAT_VERSION,
            "step": step,
            "kind": KIND,
            "format": fmt,
            "world": self.world,
            "created": time.time(),
            "checksum": checksum.DEFAULT,
            "files": files,
            "ranks": ranks,
            "meta": dict(meta or {}),
        }
        write_file(folder / MANIFEST, [json.dumps(manifest, indent=1).encode()])
        final = record.commit(step)  # the store's one way in: drop .owner, fsync, rename, fsync
        self._record = None
        manifest["seconds"] = round(time.monotonic() - started, 6)
        try:
            commit.prune(self.directory, self.store.keep, self.owner)  # the newest ``keep`` steps stay
        except OSError as exc:
            log.warning("cannot delete old checkpoints in %s: %s", self.directory, exc)
        return Checkpoint(step, final, manifest)

    # ------------------------------------------------------------------------------------ restoring

    def restore(self, load: Callable[[Checkpoint], T]) -> tuple[Checkpoint, T] | None:
        """The newest sharded checkpoint that every rank finds intact and loads, with what ``load``
        returned; None (on every rank) when there is none. Every rank must call it."""
        below: int | None = None
        while True:
            steps = [s for s in self.store.steps() if below is None or s < below]
            step = self.agreement.agree([steps[-1] if steps else -1])[0]
            if step < 0:
                return None
            found = self.store.open(step)
            problem = self._check(found, step)
            if self._rejected(problem, step, "damaged"):
                below = step
                continue
            assert found is not None
            value = self._guard(partial(load, found))
            problem = f"cannot load it: {value}" if isinstance(value, Exception) else None
            if self._rejected(problem, step, "unloadable"):
                below = step
                continue
            return found, value

    def _check(self, found: Checkpoint | None, step: int) -> str | None:
        if found is None:
            return "no readable manifest"
        if found.kind != KIND:
            return f"not a sharded checkpoint (kind {found.kind!r})"
        files = found.manifest.get("files")
        if not isinstance(files, dict) or not files:
            return "manifest lists no files"
        for name in sorted(files)[self.rank :: self.world]:
            try:
                verify_file(found.path / name, files[name])
            except Damaged as exc:
                return f"{name}: {exc}" if name not in str(exc) else str(exc)
        return None

    def _rejected(self, problem: str | None, step: int, what: str) -> bool:
        if problem is not None:
            log.warning(
                "rank %d: checkpoint %s is %s (%s); all ranks try an older one",
                self.rank,
                self.directory / step_name(step),
                what,
                problem,
            )
        return bool(self.agreement.agree([int(problem is not None)])[0])


# ---------------------------------------------------------------------------------- per-rank files


def objects_writer(payload: Any, rank: int) -> Writer:
    """A writer of any picklable payload as this rank's own files (``rank-0000r/``)."""
    snap = snapshot_of(payload)

    def write(folder: Path) -> list[str]:
        sub = folder / RANK_FOLDER.format(rank=rank)
        sub.mkdir(exist_ok=True)
        names = []
        for name, pieces in snap.files.items():
            write_file(sub / name, pieces)
            names.append(f"{sub.name}/{name}")
        info = {"kind": snap.kind, "names": sorted(snap.files), **snap.extra}
        write_file(sub / "snapshot.json", [json.dumps(info).encode()])
        return [*names, f"{sub.name}/snapshot.json"]

    return write


def objects_loader(rank: int) -> Callable[[Checkpoint], Any]:
    """Load what ``objects_writer`` wrote for ``rank`` (the world size must be the one that saved)."""

    def load(found: Checkpoint) -> Any:
        world = found.manifest.get("world")
        if rank >= int(world or 0):
            raise CheckpointError(f"the checkpoint has parts for {world} ranks, none for rank {rank}")
        sub = found.path / RANK_FOLDER.format(rank=rank)
        info = json.loads((sub / "snapshot.json").read_bytes())
        files: dict[str, dict] = {name: {} for name in info.pop("names")}
        # Verified already: each rank checked its share of every file before any rank loaded.
        return Checkpoint(found.step, sub, {**info, "files": files}).load_checked(check=False)

    return load


# ---------------------------------------------------------------------------------- files


def _durable_checksum(path: Path) -> dict:
    """fsync a file this rank wrote (any writer's: DCP's, Lightning's) and checksum it. The read-back
    finds the pages still cached, at memory speed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return file_entry(path)


__all__ = ["KIND", "ShardedStore", "objects_loader", "objects_writer", "owner_rank"]
