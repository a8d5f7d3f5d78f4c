"""The signal helper: claim intents of the watcher's outbox, send their signal, write what scancel said.

``python -m slurm_preempt.watch.sender --serve TIMEOUT`` is started once by ``watch.outbox``, in a session
of its own, and reads the paths of new intents from its stdin, one a line, each sent in a thread of its
own (batches go side by side). When the pipe closes (the watcher stopped, or died) it finishes what it
claimed and exits: a watcher killed while its signals go out leaves their outcomes behind for the next.
``python -m slurm_preempt.watch.sender INTENT TIMEOUT`` sends one.

An intent is data, never a command: the signal must be one of ``optin.SIGNALS``, every job an id
(``123`` or ``123_4``), and the file a regular file of the user the helper runs as (``watch.outbox``
keeps them in a folder no one else may write). Anything else is set aside unsent (``.corrupt``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slurm_preempt import ids
from slurm_preempt.durable import write_atomic
from slurm_preempt.errors import SlurmError
from slurm_preempt.optin import SIGNALS

INTENT, CLAIMED, DONE, ASIDE = ".intent", ".claimed", ".done", ".corrupt"
MAX_BYTES = 1 << 20


def read_owned(path: Path) -> dict[str, Any]:
    """A batch file of ours: not a symlink, a regular file of this uid, at most 1 MiB, a valid batch.
    Raises OSError or ValueError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"not a regular file of uid {os.geteuid()}")
        data = json.loads(handle.read(MAX_BYTES))
    check(data)
    return data


def check(data: Any) -> None:
    """ValueError unless ``data`` is a batch: a known signal and jobs named by ids."""
    if not isinstance(data, dict) or data.get("signal") not in SIGNALS:
        raise ValueError("not a batch of signals")
    items = data.get("items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError("a batch without a list of jobs")
    for item in items:
        if not all(isinstance(item.get(k), str) for k in ("node", "event_id", "job_id", "display_id")):
            raise ValueError("a batch item without job, node or event")
        if not (ids.is_job_id(item["job_id"]) and ids.is_job_name(item["display_id"])):
            raise ValueError("a batch item whose job is not a Slurm job id")


def act(intent: Path, slurm: Any) -> bool:
    """Claim ``intent`` (a rename: one claimer only), send it, write the outcome next to it.
    False when another actor claimed it first."""
    claimed = intent.with_suffix(CLAIMED)
    try:
        os.rename(intent, claimed)
    except FileNotFoundError:
        return False
    try:
        data = read_owned(claimed)
    except (OSError, ValueError):
        claimed.replace(claimed.with_suffix(ASIDE))
        return True
    write_atomic(claimed.with_suffix(DONE), json.dumps({**data, **send(data, slurm)}), sync=False)
    claimed.unlink()
    return True


def send(data: dict[str, Any], slurm: Any) -> dict[str, str]:
    """One scancel for the batch: what it said on stderr, or why nothing is known to be sent."""
    try:
        # By display id (A_T for array tasks): on 22.05 one task carries the array's own id, and
        # signalling that id would signal every task of the array.
        ids = [item["display_id"] for item in data["items"]]
        return {"stderr": slurm.signal_many(ids, data["signal"], batch_only=True)}
    except SlurmError as exc:  # timeout, no scancel
        return {"error": str(exc)}


def serve(lines: Iterable[str], slurm: Any) -> None:
    """Send each intent named on a line, side by side; return once the lines end and all are sent."""
    running: list[threading.Thread] = []
    for line in lines:
        running = [t for t in running if t.is_alive()]
        if line.strip():
            thread = threading.Thread(target=_act_quietly, args=(Path(line.strip()), slurm))
            thread.start()
            running.append(thread)
    for thread in running:
        thread.join()


def _act_quietly(intent: Path, slurm: Any) -> None:
    try:
        act(intent, slurm)
    except OSError:  # the folder went away: the watcher finds the claim and takes it as unknown
        pass


def main(argv: list[str]) -> int:
    from slurm_preempt.slurm.commands import Slurm

    if argv[0] == "--serve":
        serve(sys.stdin, Slurm(timeout=float(argv[1]), cwd="/"))
    else:
        act(Path(argv[0]), Slurm(timeout=float(argv[1]), cwd="/"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
