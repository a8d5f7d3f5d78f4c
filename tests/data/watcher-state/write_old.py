"""Writes a watcher state with the sentstate.py of an earlier commit: ``write_old.py FOLDER OUT.json``,
FOLDER holding that commit's module as oldstate.py (README.md here gives the commands)."""

import importlib
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

T0 = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)
PRE1, PRE2 = "pre1@2026-12-01T06:00:00Z", "pre2@2026-12-01T06:00:07Z"


def main(folder: str, out: str) -> None:
    sys.path.insert(0, folder)
    old = importlib.import_module("oldstate")
    state = old.SentState(path=Path(out))
    reason = "TogetherPreemptionNotified: reclaimed"
    state.events["pre1"] = old.NodeEvent("pre1", T0, reason, "slurm", 300.0, handled=True)
    late = T0 + timedelta(seconds=7)
    state.events["pre2"] = old.NodeEvent("pre2", late, "spot interruption", "aws", 120.0, True, True)
    v2 = "attempt" in old.SentState.mark.__code__.co_varnames
    first = {"attempt": 1, "deadline": T0 + timedelta(seconds=300)} if v2 else {}
    second = {"attempt": 0, "deadline": late + timedelta(seconds=120)} if v2 else {}
    state.mark("28069340", "pre1", "notice", T0 + timedelta(seconds=1), PRE1, **first)
    state.mark("28069340", "pre1", "signal", T0 + timedelta(seconds=1), PRE1, **first)
    state.mark("28069341", "pre2", "notice", late + timedelta(seconds=1), PRE2, **second)
    state.mark("28069341", "pre2", "enforced", late + timedelta(seconds=91), PRE2)
    state.restarts["28069339"] = {"fast_restart": 2, "fallback": "standard"}
    if v2:
        state.restarts["28069338"] = {"launch_held": 1, "launch_moved": 1}
    state.save()


if __name__ == "__main__":
    main(*sys.argv[1:3])
