"""The opt-in: what a job asked of slurm-preempt, carried in its Slurm comment.

Why the comment: only the job's owner (or an admin) can set it (``sbatch --comment`` or
``scontrol update jobid=J comment=...``), and one ``squeue`` call returns it for every job on a set of
nodes, so the watcher reads every job's wishes in the query it already makes. Nothing in it is ever
executed; the signal name is checked against a fixed list before it reaches ``scancel --signal``.

Grammar: whitespace-separated tokens ``slurm-preempt:KEY=VALUE`` anywhere in the comment; other text
is the user's own and is left alone::

    slurm-preempt:signal=USR1            signal the batch shell on a notice (``none``: notice file only)
    slurm-preempt:fallback-after=3       after 3 preemptions, move the pending job to standard nodes
    slurm-preempt:fallback-pending=1800  ... or after pending 1800 s on preemptible nodes
    slurm-preempt:fallback-to=standard   the constraint to move to (default ``standard``)
    slurm-preempt:fallback-deadline=2026-12-01T20:00:00Z
                                         ... or when, at its measured progress, it can no longer
                                         finish by then (``watch/deadline.py``)
    slurm-preempt:fallback-storm=3       ... or after 3 attempts in a row saved no newer checkpoint
    slurm-preempt:fallback-cost=10       ... or once a completed run costs more than on-demand by
                                         over 10% (0: at all) on preemptible nodes (``watch/cost.py``)
    slurm-preempt:fast-restart=0         do not skip Slurm's ~121 s requeue wait
    slurm-preempt:grow-back=600          a job below its MAX nodes may be told to requeue to come back
                                         larger when idle nodes match it, at most once per 600 s
                                         (``watch/growback.py``; the watcher's ``grow_back`` key too)
    slurm-preempt:max-nodes=3            MAX of its ``--nodes=MIN-MAX``: Slurm does not report it for a
                                         running job (squeue's MaxNodes is the count it holds)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

PREFIX = "slurm-preempt:"
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "CONT", "URG", "WINCH")
_TOKEN = re.compile(r"slurm-preempt:([a-z-]{1,20})=(\S{0,64})")
_NUMBER = re.compile(r"[0-9]{1,9}")  # ASCII: "²".isdigit() is true and int("²") fails
_DEADLINE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?(Z|[+-][0-9]{2}:[0-9]{2})?")
_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.\-&|\[\]*()]+$")


@dataclass(frozen=True)
class OptIn:
    """What the job asked for. ``signal`` is None when the job did not opt in to signals."""

    opted_in: bool = False
    signal: str | None = None
    fallback_after: int | None = None
    fallback_pending: float | None = None
    fallback_to: str = "standard"
    fast_restart: bool = True
    fallback_deadline: datetime | None = None  # UTC
    fallback_storm: int | None = None  # attempts in a row without a newer checkpoint
    fallback_cost: int | None = None  # margin in percent over the on-demand cost
    grow_back: int | None = None  # seconds at least between two grow-backs (watch/growback.py)
    max_nodes: int | None = None  # MAX of the job's node range

    def to_comment(self) -> str:
        """The tokens for ``--comment`` (the inverse of ``parse``)."""
        tokens = [f"{PREFIX}signal={self.signal or 'none'}"]
        if self.fallback_after is not None:
            tokens.append(f"{PREFIX}fallback-after={self.fallback_after}")
        if self.fallback_pending is not None:
            tokens.append(f"{PREFIX}fallback-pending={int(self.fallback_pending)}")
        if self.fallback_deadline is not None:
            tokens.append(f"{PREFIX}fallback-deadline={deadline_text(self.fallback_deadline)}")
        if self.fallback_storm is not None:
            tokens.append(f"{PREFIX}fallback-storm={self.fallback_storm}")
        if self.fallback_cost is not None:
            tokens.append(f"{PREFIX}fallback-cost={self.fallback_cost}")
        if self.fallback_to != "standard":
            tokens.append(f"{PREFIX}fallback-to={self.fallback_to}")
        if not self.fast_restart:
            tokens.append(f"{PREFIX}fast-restart=0")
        if self.grow_back is not None:
            tokens.append(f"{PREFIX}grow-back={self.grow_back}")
        if self.max_nodes is not None:
            tokens.append(f"{PREFIX}max-nodes={self.max_nodes}")
        return " ".join(tokens)


def normalize_signal(name: str) -> str | None:
    """``SIGUSR1``/``usr1``/``USR1`` -> ``USR1``; ``none`` -> None; anything else -> ValueError."""
    text = name.strip().upper()
    text = text.removeprefix("SIG")
    if text in ("NONE", ""):
        return None
    if text not in SIGNALS:
        raise ValueError(f"signal {name!r} is not one of {', '.join(SIGNALS)} or none")
    return text


def tokens(comment: str) -> list[tuple[str, str]]:
    """The ``(KEY, VALUE)`` of every token in a comment, as written (values not checked)."""
    return _TOKEN.findall(comment or "")


def parse(comment: str) -> OptIn:
    """Read the tokens of a job comment. Bad values are ignored, never trusted."""
    values = dict(tokens(comment))
    if not values:
        return OptIn()
    try:
        signal = normalize_signal(values.get("signal", "none"))
    except ValueError:
        signal = None
    return OptIn(
        opted_in=True,
        signal=signal,
        fallback_after=_positive_int(values.get("fallback-after")),
        fallback_pending=_positive_int(values.get("fallback-pending")),
        fallback_to=_constraint(values.get("fallback-to")) or "standard",
        fast_restart=values.get("fast-restart", "1") not in ("0", "no", "false"),
        fallback_deadline=parse_deadline(values.get("fallback-deadline")),
        fallback_storm=_positive_int(values.get("fallback-storm")),
        fallback_cost=margin_percent(values.get("fallback-cost")),
        grow_back=_positive_int(values.get("grow-back")),
        max_nodes=_positive_int(values.get("max-nodes"), MAX_NODES),
    )


MAX_MARGIN_PERCENT = 1000  # fallback-cost=PERCENT: more is no margin but a typo or a forgery


def margin_percent(text: str | None) -> int | None:
    """``fallback-cost``'s margin: a whole percent, 0 to ``MAX_MARGIN_PERCENT``; None for anything else."""
    if text is None or not _NUMBER.fullmatch(text) or int(text) > MAX_MARGIN_PERCENT:
        return None
    return int(text)


def unread_cost(comment: str) -> str | None:
    """The value of a ``fallback-cost`` token ``parse`` did not believe (so ignored), for the one log
    line that says so; None when the token is absent or was read."""
    value = dict(_TOKEN.findall(comment or "")).get("fallback-cost")
    return value if value is not None and margin_percent(value) is None else None


def merge_comment(user_comment: str, optin: OptIn) -> str:
    """Our tokens, then the user's own comment text (old tokens of ours replaced). Tokens first: the
    watcher reads the first 512 bytes of a comment (``slurm.parse.JOB_TEXT_FIELDS``)."""
    kept = " ".join(t for t in (user_comment or "").split() if not t.startswith(PREFIX))
    return f"{optin.to_comment()} {kept}".strip()


MAX_NODES = 100_000  # slurm.parse.MAX_NODES: more than any cluster has


def _positive_int(text: str | None, most: int | None = None) -> int | None:
    if text is None or not _NUMBER.fullmatch(text) or int(text) <= 0:
        return None
    if most is not None and int(text) > most:
        return None
    return int(text)


def parse_deadline(text: str | None) -> datetime | None:
    """``2026-12-01T20:00:00Z`` (no zone: UTC) as an aware datetime; None for anything else."""
    if not text or not _DEADLINE.fullmatch(text):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def deadline_text(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _constraint(text: str | None) -> str | None:
    return text if text and _CONSTRAINT.fullmatch(text) else None
