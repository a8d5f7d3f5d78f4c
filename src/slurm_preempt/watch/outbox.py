"""Signals in flight: written as an intent, sent, confirmed, so that no watcher's death loses or repeats one.

A batch of jobs to signal is first written as an intent file (``<name>.intent``) in the watcher's outbox
folder. Its actor claims it by renaming it to ``<name>.claimed`` (a rename succeeds once: two claimers
never both act), runs one ``scancel --signal`` for its jobs, writes the outcome (``<name>.done``: what
scancel said) and removes the claim. The watcher reads the outcome, confirms each job in its state and
removes the file.

The actor is a helper process (``watch.sender``) in a session of its own, started once and fed the
names of new intents through a pipe: it is already running when a batch is due, so a job's signal
follows its notice by milliseconds. A watcher that dies (SIGKILL, out of memory, systemd restarting
it) closes the pipe: the helper finishes the batches it claimed and exits, and the next watcher to hold
the state (the same one restarted, or the standby) finds their outcomes. An intent nobody claimed is
sent by that next watcher. A claim still without an outcome after the Slurm timeout plus
``HELPER_GRACE`` means its actor died with its machine: what it sent is unknown, and it is taken as
sent (at most once; the notice files were written before any signal, and the resume library reads them
without a signal).

The watcher waits for outcomes at most ``SEND_WAIT`` seconds: a scancel that takes longer (it retries a
job in transition every 5 s) is confirmed on a later poll, and never holds up the loop.

Without a folder (a watcher with no state directory, or a sidecar) or with ``detached`` False (unit
tests with an in-memory Slurm), the same protocol runs in threads of the watcher.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_preempt.durable import write_atomic
from slurm_preempt.slurm.interface import WatcherSlurm
from slurm_preempt.watch.sender import ASIDE, CLAIMED, DONE, INTENT, act, check, read_owned, send
from slurm_preempt.watch.threads import side_by_side

log = logging.getLogger(__name__)

HELPER_GRACE = 30.0  # seconds a helper may take beyond the Slurm timeout (a loaded machine)
SEND_WAIT = 2.0  # seconds a poll waits for the outcome of its signals before going on
LOOK_EVERY = 0.002  # seconds between looks for an outcome


@dataclass(frozen=True)
class Item:
    """One job of a batch."""

    job_id: str
    display_id: str  # what scancel is given (A_T for an array task)
    node: str
    event_id: str


@dataclass
class Batch:
    """One scancel for jobs that all want the same signal, and what came of it."""

    name: str
    signal: str
    items: list[Item]
    stderr: str = ""  # scancel's complaints, naming each job it could not signal ("" when none)
    error: str = ""  # nothing is known to be sent (timeout, no scancel): retry them all
    unknown: bool = False  # its actor died mid-way: taken as sent
    path: Path | None = None  # its outcome file, removed by ``finish`` once the watcher confirmed it

    def to_json(self) -> dict:
        return {"signal": self.signal, "items": [asdict(i) for i in self.items]}

    @classmethod
    def from_json(cls, name: str, data: dict) -> Batch:
        """From a batch file; ValueError when it is not one (see ``sender.check``)."""
        check(data)
        items = [Item(i["job_id"], i["display_id"], i["node"], i["event_id"]) for i in data["items"]]
        batch = cls(name, str(data["signal"]), items)
        batch.stderr, batch.error = str(data.get("stderr", "")), str(data.get("error", ""))
        return batch


@dataclass
class Outbox:
    """The batches of one watcher's state. ``beat`` is called while waiting (lease, watchdog)."""

    folder: Path | None
    slurm: WatcherSlurm
    detached: bool = False
    timeout: float = 15.0  # each scancel's
    beat: Callable[[], None] = lambda: None
    monotonic: Callable[[], float] = time.monotonic
    _claims_seen: dict[str, float] = field(default_factory=dict)  # claim name -> first seen (monotonic)
    _trusted: bool = False
    _helper: subprocess.Popen | None = None
    _count: int = 0

    # ------------------------------------------------------------------------------------ sending

    def plan(self, wanted: list[tuple[str, list[Item]]]) -> list[Batch]:
        """One batch per (signal, items). Detached, the helper is made ready now (it starts once)."""
        batches = [Batch(self._name(), signal, items) for signal, items in wanted if items]
        if batches and self.detached and self._usable():
            self._ready()
        return batches

    def write(self, batches: list[Batch]) -> None:
        """The intents: from here on, whoever holds the state next can finish them."""
        if batches and self._usable():
            for batch in batches:
                write_atomic(self._path(batch.name, INTENT), json.dumps(batch.to_json()), sync=False)

    def send(self, batches: list[Batch]) -> tuple[list[Batch], set[str]]:
        """Send the batches side by side. Returns those with an outcome, and the job ids of those whose
        outcome is not known yet (still sending: a later poll's ``leftovers`` has it)."""
        if self.folder is None:
            return self._in_memory(batches), set()
        return self._run([self._path(b.name, INTENT) for b in batches])

    def close(self) -> None:
        """No more batches from this watcher: its helper finishes what it claimed and exits."""
        if self._helper is not None and self._helper.stdin is not None:
            try:
                self._helper.stdin.close()
            except OSError:
                pass
        self._helper = None

    def _in_memory(self, batches: list[Batch]) -> list[Batch]:
        def one(batch: Batch) -> Batch:
            outcome = send(batch.to_json(), self.slurm)
            batch.stderr, batch.error = outcome.get("stderr", ""), outcome.get("error", "")
            return batch

        return side_by_side(one, batches)

    def _run(self, intents: list[Path]) -> tuple[list[Batch], set[str]]:
        # scancel signals its jobs one RPC after another: a few batches side by side go faster.
        if self.detached:
            self._hand_over(intents)
            self._wait_for([i.with_suffix(DONE) for i in intents])
        else:
            side_by_side(lambda path: act(path, self.slurm), intents)
        finished, in_flight = [], set()
        for intent in intents:
            batch = self._collect(intent.with_suffix(DONE))
            if batch is not None:
                finished.append(batch)
            else:  # not done yet (a slow scancel): a later poll's leftovers() picks it up
                in_flight |= self._ids(intent)
        return finished, in_flight

    def _ready(self) -> subprocess.Popen:
        if self._helper is None or self._helper.poll() is not None:
            # A session of its own, and nothing of ours it could die of: a signal to the watcher's
            # process group does not reach it, and the pipe only feeds it (it never writes to us).
            argv = [*isolated_python(), "-m", "slurm_preempt.watch.sender", "--serve", f"{self.timeout:g}"]
            self._helper = subprocess.Popen(
                argv,
                cwd="/",
                env=isolated_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
            )
        return self._helper

    def _hand_over(self, intents: list[Path]) -> None:
        lines = "".join(f"{intent}\n" for intent in intents)
        for _attempt in range(2):  # a helper that died (killed, crashed) is started again once
            helper = self._ready()
            try:
                assert helper.stdin is not None
                helper.stdin.write(lines)
                helper.stdin.flush()
                return
            except (BrokenPipeError, OSError) as exc:
                log.warning("signal helper %d is gone (%s): starting another", helper.pid, exc)
                self._helper = None
        log.error("no signal helper: the batches stay as intents for the next poll")

    def _wait_for(self, outcomes: list[Path]) -> None:
        end = self.monotonic() + SEND_WAIT
        left = list(outcomes)
        while left and self.monotonic() < end:
            time.sleep(LOOK_EVERY)
            left = [path for path in left if not path.exists()]
            self.beat()

    # ------------------------------------------------------------------------------------ leftovers

    def leftovers(self) -> tuple[list[Batch], set[str]]:
        """Batches an earlier watcher (or a slow scancel) left: outcomes written, intents never claimed
        (sent now), claims whose actor died (taken as sent). Also the job ids still in flight."""
        if not self._usable():
            return [], set()
        assert self.folder is not None
        if self.detached:
            self._ready()  # from the first poll on: the first signal waits for no process start
        names = sorted(os.listdir(self.folder))
        finished = [b for b in map(self._collect, self._with(names, DONE)) if b is not None]
        intents = self._with(names, INTENT)
        more, in_flight = self._run(intents) if intents else ([], set())
        finished += more
        claims = self._with(names, CLAIMED)
        stale = self._stale(claims)
        finished += stale
        for claim in set(claims) - {b.path for b in stale}:
            if claim.exists():
                in_flight |= self._ids(claim)
        return finished, in_flight

    def _stale(self, claims: list[Path]) -> list[Batch]:
        now, stale = self.monotonic(), []
        names = {c.name for c in claims}
        self._claims_seen = {n: t for n, t in self._claims_seen.items() if n in names}
        for claim in claims:
            first = self._claims_seen.setdefault(claim.name, now)
            if now - first < self.timeout + HELPER_GRACE:
                continue
            batch = self._read(claim)
            self._claims_seen.pop(claim.name, None)
            if batch is not None:
                batch.unknown, batch.path = True, claim
                stale.append(batch)
        return stale

    # ------------------------------------------------------------------------------------ files

    def _usable(self) -> bool:
        """The folder exists, is this uid's and no one else may write in it (made 0700): a file in it
        makes this watcher run scancel, as root for the daemon. If not, the outbox works in memory
        (logged once)."""
        if self.folder is None:
            return False
        if self._trusted:
            return True
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(self.folder)
            problem = "" if stat.S_ISDIR(info.st_mode) else "not a folder"
            # Made 0700; one of ours that others may read (an older one) is still safe to use.
            if not problem and (info.st_uid != os.geteuid() or info.st_mode & 0o022):
                mode = stat.S_IMODE(info.st_mode)
                problem = f"uid {info.st_uid}, mode {mode:o}: others may write in it"
        except OSError as exc:
            problem = str(exc)
        if problem:
            log.error("outbox %s cannot be trusted (%s): signals are sent from memory", self.folder, problem)
            self.folder = None
            return False
        self._trusted = True
        return True

    def finish(self, batches: list[Batch]) -> None:
        """The watcher has confirmed these outcomes (ledger and state): their files may go. Until then a
        watcher killed mid-way leaves them for the next one."""
        for batch in batches:
            if batch.path is not None:
                batch.path.unlink(missing_ok=True)

    def _collect(self, done: Path) -> Batch | None:
        batch = self._read(done)
        if batch is not None:
            batch.path = done
        return batch

    def _read(self, path: Path) -> Batch | None:
        try:
            return Batch.from_json(path.stem, read_owned(path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("outbox file %s is not a batch of ours (%s): set aside, not sent", path, exc)
            path.replace(path.with_suffix(ASIDE))
            return None

    def _ids(self, path: Path) -> set[str]:
        for candidate in (path, path.with_suffix(CLAIMED), path.with_suffix(DONE)):
            batch = self._read(candidate) if candidate.exists() else None
            if batch is not None:
                return {i.job_id for i in batch.items}
        return set()

    def _with(self, names: list[str], suffix: str) -> list[Path]:
        assert self.folder is not None
        return [self.folder / n for n in names if n.endswith(suffix) and not n.startswith(".")]

    def _path(self, name: str, suffix: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{name}{suffix}"

    def _name(self) -> str:
        self._count += 1
        return f"{time.time_ns()}-{socket.gethostname().split('.')[0]}-{os.getpid()}-{self._count}"


def isolated_python() -> list[str]:
    """This interpreter, started so that nothing in its working directory is imported: ``python -m``
    puts the current folder first on ``sys.path``, and a watcher an admin started from a folder a user
    can write would run that user's ``slurm_preempt/watch/sender.py`` as root. The helper runs from
    "/" (``cwd``), and ``-P`` (3.11+) leaves even that out; ``PYTHONPATH`` and the user's site stay, for
    installs that live there (``-I`` would drop them; on 3.10 "/" is the first entry, which only root
    may write)."""
    return [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]


def isolated_env() -> dict[str, str]:
    """This environment with only absolute ``PYTHONPATH`` entries (an empty or relative one names the
    working directory), and for root no ``PYTHONUSERBASE`` (a user site somewhere else than root's)."""
    dropped = ("PYTHONUSERBASE",) if os.geteuid() == 0 else ()
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    if "PYTHONPATH" in env:
        kept = [entry for entry in env["PYTHONPATH"].split(os.pathsep) if os.path.isabs(entry)]
        env["PYTHONPATH"] = os.pathsep.join(kept)
        if not kept:
            del env["PYTHONPATH"]
    return env
