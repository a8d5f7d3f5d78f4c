"""A preemption trace: the times at which nodes were taken, read from a text file.

One preemption per line, ``TIME`` or ``TIME NODE``: the time as ISO 8601 (``2026-12-01T07:37:00Z``;
no zone means UTC) or epoch seconds, the node's name optional (without names every line is one node's).
``#`` starts a comment. The simulator resamples the gaps between one node's consecutive preemptions,
so a trace keeps whatever shape the field had (bursts, long quiet spells) that a mean would hide.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from slurm_preempt.errors import UsageError

MAX_BYTES = 16 * 1024 * 1024
MIN_GAPS = 2


def read_gaps(path: Path) -> tuple[float, ...]:
    """Seconds between consecutive preemptions of each node in the trace file at ``path``."""
    times = _read_times(path)
    gaps: list[float] = []
    for node_times in times.values():
        node_times.sort()
        gaps.extend(b - a for a, b in zip(node_times, node_times[1:], strict=False))
    if any(gap <= 0 for gap in gaps):
        raise UsageError(f"--trace {path}: one node preempted twice at the same time: not a trace")
    if len(gaps) < MIN_GAPS:
        raise UsageError(
            f"--trace {path}: {len(gaps)} gap(s) between preemptions of one node; need at least {MIN_GAPS}"
        )
    return tuple(gaps)


def _read_times(path: Path) -> dict[str, list[float]]:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise UsageError(f"--trace {path}: larger than {MAX_BYTES // 2**20} MiB: not a trace")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--trace {path}: not text (UTF-8): not a trace") from None
    except OSError as exc:
        raise UsageError(f"--trace {path}: cannot read it ({exc.strerror or exc})") from None
    times: dict[str, list[float]] = defaultdict(list)
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise UsageError(f"--trace {path}: line {number}: expected TIME [NODE], got {line.strip()!r:.80}")
        times[words[1] if len(words) == 2 else ""].append(_seconds(words[0], path, number))
    return times


def _seconds(word: str, path: Path, number: int) -> float:
    try:
        value = float(word)
    except ValueError:
        try:
            moment = datetime.fromisoformat(word.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(f"--trace {path}: line {number}: {word!r:.60} is not a time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"--trace {path}: line {number}: {word!r:.60} is not a time")
    return value
