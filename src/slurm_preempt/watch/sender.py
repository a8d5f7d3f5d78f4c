"""The signal helper: claim one intent of the watcher's outbox, send its signal, write what scancel said.

``python -m slurm_preempt.watch.sender INTENT TIMEOUT``, started by ``watch.outbox`` in a session of its
own so that it outlives a watcher killed while it runs. It imports little (a job's signal waits for it
to start): no logging, no parsers.

An intent is data, never a command: the signal must be one of ``optin.SIGNALS``, every job an id
(``123`` or ``123_4``), and the file a regular file of the user the helper runs as (``watch.outbox``
keeps them in a folder no one else may write). Anything else is set aside unsent (``.corrupt``).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any

from slurm_preempt.errors import SlurmError
from slurm_preempt.optin import SIGNALS
from slurm_preempt.watch.sentstate import write_atomic

INTENT, CLAIMED, DONE, ASIDE = ".intent", ".claimed", ".done", ".corrupt"
MAX_BYTES = 1 << 20
INTENT_WAIT = 60.0  # seconds a helper started ahead of its intent waits for it
WAIT_STEP = 0.005
_JOB_ID = re.compile(r"\d+(?:_\d+)?")


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
        if not (_JOB_ID.fullmatch(item["job_id"]) and _JOB_ID.fullmatch(item["display_id"])):
            raise ValueError("a batch item whose job is not a Slurm job id")


def act(intent: Path, slurm: Any, wait: float = 0.0) -> bool:
    """Claim ``intent`` (a rename: one claimer only), send it, write the outcome next to it. Waits up to
    ``wait`` seconds for the intent to be written. False when another actor claimed it, or it never came
    (the watcher died, or lost its lease, before writing it)."""
    claimed = intent.with_suffix(CLAIMED)
    if not _claim(intent, claimed, time.monotonic() + wait):
        return False
    try:
        data = read_owned(claimed)
    except (OSError, ValueError):
        claimed.replace(claimed.with_suffix(ASIDE))
        return True
    write_atomic(claimed.with_suffix(DONE), json.dumps({**data, **send(data, slurm)}), sync=False)
    claimed.unlink()
    return True


def _claim(intent: Path, claimed: Path, deadline: float) -> bool:
    while True:
        try:
            os.rename(intent, claimed)
            return True
        except FileNotFoundError:
            if time.monotonic() >= deadline or claimed.exists() or claimed.with_suffix(DONE).exists():
                return False
            time.sleep(WAIT_STEP)


def send(data: dict[str, Any], slurm: Any) -> dict[str, str]:
    """One scancel for the batch: what it said on stderr, or why nothing is known to be sent."""
    try:
        # By display id (A_T for array tasks): on 22.05 one task carries the array's own id, and
        # signalling that id would signal every task of the array.
        ids = [item["display_id"] for item in data["items"]]
        return {"stderr": slurm.signal_many(ids, data["signal"], batch_only=True)}
    except SlurmError as exc:  # timeout, no scancel
        return {"error": str(exc)}


def main(argv: list[str]) -> int:
    from slurm_preempt.slurm.commands import Slurm

    act(Path(argv[0]), Slurm(timeout=float(argv[1])), wait=INTENT_WAIT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
