"""Typed records of Slurm nodes, jobs and accounting rows, and the pure parsers that build them.

Nothing here runs a command: ``slurm.py`` runs them and hands the text to these functions, which the
tests feed with output captured from real Slurm 22.05 and 24.11 (tests/data/).

Why text and not ``--json``: ``sinfo/squeue/sacct --json`` exist in 22.05 but their shapes changed in
23.02 and again in 24.05 (plain numbers became ``{"set":..,"number":..}``, state strings became lists),
while the ``-O field:suffix`` text output has kept its field names. We ask for explicit fields joined
by an ASCII unit separator and put the one free-text field last, so a ``|`` or a space in a drain
reason or a job comment cannot shift the columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from slurm_preempt.errors import UsageError

SEP = "\x1f"  # ASCII unit separator: never in node names, states, user names or times

# The fields asked of `sinfo -N -O` and `squeue -O`, in order. The free-text field comes last.
NODE_FIELDS = ("NodeList", "StateComplete", "Features", "TimeStamp", "UserLong", "Reason")
JOB_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "Reason",
    "NodeList",
    "RestartCnt",
    "UserName",
    "Partition",
    "NumNodes",
    "StartTime",
    "SubmitTime",
    "EligibleTime",
    "Feature",
    "Name",
    "Comment",
)
# `sacct -P` already uses "|" and quotes nothing; NodeList and State never hold "|".
ACCT_FIELDS = (
    "JobIDRaw",
    "JobID",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "NNodes",
    "NodeList",
    "Partition",
    "User",
    "Constraints",
    "AllocTRES",
)

_EMPTY = {"", "(null)", "none", "None", "N/A", "Unknown", "n/a", "None assigned"}
_BUSY_STATES = {"ALLOCATED", "MIXED", "COMPLETING"}


def format_arg(fields: tuple[str, ...]) -> str:
    """The ``-O`` argument: every field printed whole and followed by the separator."""
    return ",".join(f"{name}:{SEP}" for name in fields)


# ---------------------------------------------------------------------------------------- hostlists


def expand_nodes(expression: str) -> list[str]:
    """``pre[1-3],std1`` -> ``['pre1', 'pre2', 'pre3', 'std1']`` (Slurm's order kept, no duplicates)."""
    text = expression.strip()
    if text in _EMPTY:
        return []
    try:
        names = list(NodeSet(text))
    except NodeSetParseError as exc:
        raise UsageError(f"not a Slurm node list: {expression!r} ({exc})") from None
    return names


def compress_nodes(names) -> str:
    """``['pre1', 'pre2', 'std1']`` -> ``pre[1-2],std1``."""
    return str(NodeSet.fromlist(list(names))) if names else ""


# ---------------------------------------------------------------------------------------- times


def parse_time(text: str, local_tz: timezone | None = None) -> datetime | None:
    """A Slurm timestamp (``2026-12-01T06:06:41``, in the controller's local time) as aware UTC.

    Slurm prints local time without an offset; ``local_tz`` says which (default: this host's).
    ``Unknown``, ``N/A``, ``None`` and empty give None.
    """
    text = text.strip()
    if text in _EMPTY:
        return None
    try:
        naive = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    aware = naive.replace(tzinfo=local_tz) if local_tz else naive.astimezone()
    return aware.astimezone(timezone.utc)


def _text(value: str) -> str:
    value = value.strip()
    return "" if value in _EMPTY else value


def _int(value: str, default: int = 0) -> int:
    try:
        return int(value.strip())
    except ValueError:
        return default


# ---------------------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Node:
    """One node as ``sinfo`` reports it."""

    name: str
    state: str  # base state, upper case: IDLE, MIXED, ALLOCATED, DOWN, ...
    flags: frozenset[str] = frozenset()  # DRAIN, NOT_RESPONDING, COMPLETING, ...
    features: tuple[str, ...] = ()
    reason: str = ""
    reason_time: datetime | None = None
    reason_user: str = ""

    @property
    def drain(self) -> bool:
        """Drained or draining: no new job starts here."""
        return "DRAIN" in self.flags or self.state in ("DRAINED", "DRAINING")

    @property
    def draining(self) -> bool:
        """Drain set while jobs still run (the T+0..T+5:00 window of a preemption)."""
        return self.drain and (self.state in _BUSY_STATES or self.state == "DRAINING")

    @property
    def down(self) -> bool:
        return self.state == "DOWN" or "DOWN" in self.flags

    @property
    def available(self) -> bool:
        return not (self.drain or self.down) and "NOT_RESPONDING" not in self.flags

    def has_feature(self, feature: str) -> bool:
        return feature in self.features


def parse_state(text: str) -> tuple[str, frozenset[str]]:
    """``allocated+drain`` -> (``ALLOCATED``, {``DRAIN``}); ``down*`` -> (``DOWN``, {``NOT_RESPONDING``})."""
    parts = [p for p in text.strip().upper().split("+") if p]
    if not parts:
        return "UNKNOWN", frozenset()
    flags: set[str] = set()
    base = parts[0]
    # Short forms carry a suffix: * not responding, ~ powered off, # powering up, % powering down.
    if base.endswith("*"):
        flags.add("NOT_RESPONDING")
    base = base.rstrip("*~#%$@^-!")
    flags.update(p.rstrip("*~#%$@^-!") for p in parts[1:])
    return base, frozenset(flags)


def parse_nodes(output: str, local_tz: timezone | None = None) -> list[Node]:
    """Parse ``sinfo -h -N -O <NODE_FIELDS>`` output. A node in several partitions is listed once."""
    nodes: dict[str, Node] = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        cols = line.split(SEP, len(NODE_FIELDS) - 1)
        if len(cols) < len(NODE_FIELDS):
            continue
        name, state_text, features, stamp, user, reason = (c.strip() for c in cols)
        state, flags = parse_state(state_text)
        reason = reason.rstrip(SEP).strip()
        nodes.setdefault(
            name,
            Node(
                name=name,
                state=state,
                flags=flags,
                features=tuple(f for f in _text(features).split(",") if f),
                reason=_text(reason),
                reason_time=parse_time(stamp, local_tz),
                reason_user=_text(user).split("(")[0],
            ),
        )
    return list(nodes.values())


# ---------------------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Job:
    """One job (or one array task) as ``squeue`` reports it."""

    job_id: str  # the unique id Slurm acts on (never "123_4")
    state: str
    reason: str = ""
    nodes: tuple[str, ...] = ()
    restart_count: int = 0
    user: str = ""
    name: str = ""
    partition: str = ""
    num_nodes: int = 0
    start_time: datetime | None = None
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    features: str = ""
    comment: str = ""
    array_job_id: str = ""
    array_task_id: str = ""

    @property
    def display_id(self) -> str:
        """``123_4`` for an array task, else the job id."""
        if self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


def parse_jobs(output: str, local_tz: timezone | None = None) -> list[Job]:
    """Parse ``squeue -h -O <JOB_FIELDS>`` output."""
    jobs = []
    for line in output.splitlines():
        if not line.strip():
            continue
        cols = line.split(SEP, len(JOB_FIELDS) - 1)
        if len(cols) < len(JOB_FIELDS):
            continue
        (jid, ajid, atid, state, reason, nodelist, restarts, user, part, nnodes) = (
            c.strip() for c in cols[:10]
        )
        start, submit, eligible, feature, name, comment = cols[10:]
        is_array = _text(atid) != ""
        jobs.append(
            Job(
                job_id=jid,
                state=state.upper(),
                reason=_text(reason),
                nodes=tuple(expand_nodes(nodelist)) if _text(nodelist) else (),
                restart_count=_int(restarts),
                user=user,
                name=name.strip(),
                partition=part,
                num_nodes=_int(nnodes),
                start_time=parse_time(start, local_tz),
                submit_time=parse_time(submit, local_tz),
                eligible_time=parse_time(eligible, local_tz),
                features=_text(feature),
                comment=_text(comment.rstrip(SEP)),
                array_job_id=ajid if is_array else "",
                array_task_id=_text(atid) if is_array else "",
            )
        )
    return jobs


# ---------------------------------------------------------------------------------------- accounting


@dataclass(frozen=True)
class AcctRecord:
    """One row of ``sacct -D -X``: one attempt of a job (``-D`` keeps the requeued ones)."""

    job_id: str
    display_id: str
    state: str  # COMPLETED, REQUEUED, NODE_FAIL, PREEMPTED, CANCELLED, TIMEOUT, FAILED, RUNNING...
    exit_code: str = "0:0"
    submit: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None
    num_nodes: int = 0
    nodes: tuple[str, ...] = ()
    partition: str = ""
    user: str = ""
    constraints: str = ""
    alloc_tres: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return _int(self.alloc_tres.get("gres/gpu", "0"))

    @property
    def cpus(self) -> int:
        return _int(self.alloc_tres.get("cpu", "0"))


def parse_acct(output: str, local_tz: timezone | None = None) -> list[AcctRecord]:
    """Parse ``sacct -n -P -X -D --format=<ACCT_FIELDS>`` output."""
    rows = []
    for line in output.splitlines():
        cols = line.split("|")
        if len(cols) < len(ACCT_FIELDS):
            continue
        raw, jid, state, exit_code, submit, start, end, nnodes, nodelist, part, user, cons, tres = cols[
            : len(ACCT_FIELDS)
        ]
        # "CANCELLED by 0" -> CANCELLED
        state = state.split()[0].upper() if state.strip() else "UNKNOWN"
        tres_map = dict(kv.split("=", 1) for kv in tres.split(",") if "=" in kv)
        rows.append(
            AcctRecord(
                job_id=raw.strip(),
                display_id=jid.strip(),
                state=state,
                exit_code=exit_code.strip(),
                submit=parse_time(submit, local_tz),
                start=parse_time(start, local_tz),
                end=parse_time(end, local_tz),
                num_nodes=_int(nnodes),
                nodes=tuple(expand_nodes(nodelist)) if _text(nodelist) else (),
                partition=part.strip(),
                user=user.strip(),
                constraints=_text(cons),
                alloc_tres=tres_map,
            )
        )
    return rows


def parse_config(output: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = value`` lines, same on 22.05 to 26.05) -> {key: value}."""
    found = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found[key.strip()] = value.strip()
    return found


def scheduler_parameters(config: dict[str, str]) -> dict[str, str]:
    """``SchedulerParameters`` as {option: value} (``bf_continue`` -> ``""``)."""
    text = _text(config.get("SchedulerParameters", ""))
    pairs = (item.partition("=") for item in text.split(",") if item.strip())
    return {key.strip(): value.strip() for key, _sep, value in pairs}


def parse_version(output: str) -> tuple[int, int]:
    """``slurm 22.05.8`` -> (22, 5); ``slurm-wlm 24.11.5`` -> (24, 11)."""
    for token in output.split():
        bits = token.split(".")
        if len(bits) >= 2 and bits[0].isdigit() and bits[1].isdigit():
            return int(bits[0]), int(bits[1])
    raise ValueError(f"no Slurm version in {output!r}")


def parse_submitted(output: str) -> str:
    """``sbatch --parsable`` prints ``123`` or ``123;cluster``: the job id."""
    text = output.strip().splitlines()[-1] if output.strip() else ""
    job_id = text.split(";")[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"sbatch printed no job id: {output.strip()!r}")
    return job_id
