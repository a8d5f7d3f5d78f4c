"""Real unprivileged users for tests that act as a hostile cluster user would (root only).

``ensure_user`` creates a system user once (idempotent, no home, no login shell) and never removes one:
the local cluster's slurmd runs on this host, so a job's user must exist here. ``as_user`` runs a
function in a forked child that has dropped to that user, the way a user's own process would race root.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Callable

MALLORY = "sp-mallory"  # the hostile user
ALICE = "sp-alice"  # another user, whose jobs must be left alone


def ensure_user(name: str) -> tuple[int, int]:
    """(uid, gid) of ``name``, created when missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode not in (0, 9):  # 9: made meanwhile by another test session
            raise RuntimeError(f"useradd {name}: {done.stderr.strip()}") from None
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


def as_user(name: str, work: Callable[[], None]) -> int:
    """Fork; the child drops to ``name`` and runs ``work``; returns the child's pid (reap it)."""
    uid, gid = ensure_user(name)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            work()
        except BaseException:
            code = 1
        os._exit(code)
    return pid
