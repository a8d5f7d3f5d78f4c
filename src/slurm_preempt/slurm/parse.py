"""Typed records of Slurm nodes and jobs, and the pure parsers that build them (accounting rows:
``sacct.py``).

Nothing here runs a command: ``commands.py`` runs them and hands the bytes to these functions, which the
tests feed with output captured from real Slurm 22.05 (tests/data/) and with hostile bytes (hypothesis).

Why text and not ``--json``: ``sinfo/squeue/sacct --json`` exist in 22.05 but their shapes changed in
23.02 and again in 24.05 (plain numbers became ``{"set":..,"number":..}``, state strings became lists),
and ``squeue --json`` prints every field of every job (bench/bench_squeue_format.py measures it), while
the ``-O field:size`` text output has kept its field names.

Everything a user can write is data, never structure. Slurm prints a job's name and comment raw, with
any bytes (newlines, the separator, invalid UTF-8), so a record break cannot be found by looking for
one. The records are therefore framed by what Slurm itself controls: the fields Slurm writes (ids,
states, node lists, numbers, times) each end in an ASCII unit separator, and the fields a user or an
admin writes (names, comments, constraints, reasons) are asked for at a fixed width, which squeue and
sinfo print as exactly that many bytes (cut or padded with spaces; checked on 22.05 with newlines,
separators and invalid UTF-8 inside). A record is therefore read as N separator-ended fields, then
fixed-size fields, then one newline, and nothing inside the fixed-size fields is ever looked at as
structure. Text is decoded after framing, with replacement. A record whose Slurm fields do not have
their shape (a job id that is not a number, a node name with a bracket) is refused with one log line
and the others are kept; output that does not frame at all raises SlurmError (the poll is retried)
rather than guess where a record starts.

Times are asked for as epoch seconds (``SLURM_TIME_FORMAT=%s``, set by ``commands.Slurm``), so the
watcher host's time zone never moves a deadline. ISO text (older captures, ``sacct`` fallbacks) is read
in ``local_tz``, UTC unless told otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetParseError

from slurm_preempt import ids
from slurm_preempt.errors import SlurmError, UsageError

log = logging.getLogger(__name__)

SEP = "\x1f"  # ASCII unit separator: never in node names, states, user names, numbers or times
_SEP = SEP.encode()
TIME_FORMAT_ENV = {"SLURM_TIME_FORMAT": "%s"}  # every Slurm client prints times as epoch seconds

# `sinfo -N -O`: the fields Slurm writes, each ending in SEP, then the admin's (or provider's) reason.
NODE_FIELDS = ("NodeList", "StateComplete", "Features", "TimeStamp", "UserLong")
NODE_TEXT_FIELDS = (("Reason", 256),)
# `squeue -O`: the fields Slurm writes, then those a user or admin writes, each at a fixed width. The
# opt-in tokens are at the start of a comment (optin.merge_comment puts them there): 512 bytes hold
# them and a sentence of the user's own (bench/bench_squeue_format.py measures the cost).
JOB_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "NodeList",
    "RestartCnt",
    "UserName",
    "Partition",
    "NumNodes",
    "StartTime",
    "SubmitTime",
    "EligibleTime",
)
JOB_TEXT_FIELDS = (("Reason", 48), ("Feature", 128), ("Name", 64), ("Comment", 512))

_EMPTY = {"", "(null)", "none", "None", "N/A", "Unknown", "n/a", "None assigned"}
_BUSY_STATES = {"ALLOCATED", "MIXED", "COMPLETING"}
_STATE_SUFFIXES = "*~#%$@^-!"


def format_arg(fields: Sequence[str], text_fields: Sequence[tuple[str, int]] = ()) -> str:
    """The ``-O`` argument: Slurm's fields whole, each followed by SEP; then the text fields at their
    fixed widths (``Comment:1024``: exactly 1024 bytes, cut or padded)."""
    return ",".join([f"{name}:{SEP}" for name in fields] + [f"{name}:{width}" for name, width in text_fields])


def frame(output: bytes | str, fields: int, widths: Sequence[int]) -> Iterator[list[bytes]]:
    """Split output asked for with ``format_arg`` into records, each a list of raw fields.

    The only bytes looked at as structure are those Slurm writes: a SEP ends each of the first
    ``fields`` fields (which may hold no newline), the next ``widths`` fields are taken by count, then
    a newline must follow. SlurmError when the output does not have that shape.
    """
    data = output.encode("utf-8", "surrogateescape") if isinstance(output, str) else output
    pos, count = 0, 0
    while pos < len(data):
        record = []
        for _ in range(fields):
            end = data.find(_SEP, pos)
            if end < 0 or b"\n" in data[pos:end]:
                raise _unframed(pos, count)
            record.append(data[pos:end])
            pos = end + 1
        for width in widths:
            if pos + width > len(data):
                raise _unframed(pos, count)
            record.append(data[pos : pos + width])
            pos += width
        if data[pos : pos + 1] != b"\n":
            raise _unframed(pos, count)
        pos += 1
        count += 1
        yield record


def _unframed(pos: int, count: int) -> SlurmError:
    why = f"Slurm's output does not have the fields asked for at byte {pos} (after {count} records)"
    return SlurmError(["parse"], None, why)


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------- hostlists


MAX_NODES = 100_000  # more names than any cluster has: a node list past it is not Slurm's


def expand_nodes(expression: str) -> list[str]:
    """``pre[1-3],std1`` -> ``['pre1', 'pre2', 'pre3', 'std1']`` (Slurm's order kept, no duplicates).

    Never resolves ``@group`` names (ClusterShell would ask its configured group sources, which may run
    commands), and refuses a list of more than MAX_NODES names before expanding it."""
    text = expression.strip()
    if text in _EMPTY:
        return []
    try:
        nodeset = NodeSet(text, resolver=RESOLVER_NOGROUP)
        if len(nodeset) > MAX_NODES:
            raise UsageError(f"not a Slurm node list: {ids.shorten(expression)} names {len(nodeset)} nodes")
        return list(nodeset)
    except UsageError:
        raise
    except (NodeSetParseError, AssertionError, ValueError, TypeError, OverflowError) as exc:
        # ClusterShell answers a huge range with an AssertionError, not a parse error.
        raise UsageError(f"not a Slurm node list: {ids.shorten(expression)} ({exc})") from None


def compress_nodes(names) -> str:
    """``['pre1', 'pre2', 'std1']`` -> ``pre[1-2],std1``. Every name must be a node name (``ids``): a
    name with a bracket or a comma would be a host list of other nodes, one starting with ``-`` an
    option. ValueError otherwise."""
    names = [ids.node_name(n) for n in names]
    return str(NodeSet.fromlist(names)) if names else ""


# ---------------------------------------------------------------------------------------- times

_EPOCH_MAX = 2**33  # year 2242: past that a number is not a Slurm time


def parse_time(text: str, local_tz: timezone | None = None) -> datetime | None:
    """A Slurm time as aware UTC: epoch seconds (``SLURM_TIME_FORMAT=%s``, what ``commands`` asks for)
    or ``2026-12-01T06:06:41`` in ``local_tz`` (UTC when None: never this host's zone).
    ``Unknown``, ``N/A``, ``None``, empty and anything else give None."""
    text = text.strip()
    if text in _EMPTY:
        return None
    if text.isascii() and text.isdigit():
        seconds = int(text[:12])
        return datetime.fromtimestamp(seconds, timezone.utc) if 0 < seconds < _EPOCH_MAX else None
    try:
        naive = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return naive.replace(tzinfo=local_tz or timezone.utc).astimezone(timezone.utc)


def clean_text(value: str) -> str:
    value = value.strip()
    return "" if value in _EMPTY else value


def to_int(value: str, default: int = 0) -> int:
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 12:
        return default
    return int(value)


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
    """``allocated+drain`` -> (``ALLOCATED``, {``DRAIN``}); ``down*`` -> (``DOWN``, {``NOT_RESPONDING``}).
    ValueError for anything that is not Slurm's words."""
    parts = [p for p in text.strip().upper().split("+") if p]
    if not parts:
        return "UNKNOWN", frozenset()
    flags: set[str] = set()
    base = parts[0]
    # Short forms carry a suffix: * not responding, ~ powered off, # powering up, % powering down.
    if base.endswith("*"):
        flags.add("NOT_RESPONDING")
    base = base.rstrip(_STATE_SUFFIXES)
    flags.update(p.rstrip(_STATE_SUFFIXES) for p in parts[1:])
    if not all(word.isascii() and word.replace("_", "").isalpha() for word in (base, *flags)):
        raise ValueError(f"not a Slurm state: {ids.shorten(text)}")
    return base, frozenset(flags)


def parse_nodes(output: bytes | str, local_tz: timezone | None = None) -> list[Node]:
    """Parse ``sinfo -h -N -O <format_arg(NODE_FIELDS, NODE_TEXT_FIELDS)>`` output. A node in several
    partitions is listed once; a record that is not a node is refused (one log line each)."""
    nodes: dict[str, Node] = {}
    widths = [w for _, w in NODE_TEXT_FIELDS]
    for raw in frame(output, len(NODE_FIELDS), widths):
        try:
            node = node_record([decode(c) for c in raw], local_tz)
        except ValueError as exc:
            log.warning("sinfo record refused: %s", exc)
            continue
        nodes.setdefault(node.name, node)
    return list(nodes.values())


def node_record(cols: Sequence[str], local_tz: timezone | None = None) -> Node:
    """One node from its fields as ``sinfo`` prints them (NODE_FIELDS, then NODE_TEXT_FIELDS): the CLI
    and the pyslurm backend both build their records here. ValueError when they are not a node's."""
    name, state_text, features, stamp, user, reason = cols
    ids.node_name(name)
    state, flags = parse_state(state_text)
    return Node(
        name=name,
        state=state,
        flags=flags,
        features=tuple(f for f in clean_text(features).split(",") if f),
        reason=clean_text(reason),
        reason_time=parse_time(stamp, local_tz),
        reason_user=clean_text(user).split("(")[0],
    )


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
        """``123_4`` for an array task, else the job id. A pending array's record not yet split into
        tasks gives ``123_2-5%1``, which names no single job (``ids.is_job_name`` is False)."""
        if self.array_task_id:
            return f"{self.array_job_id}_{self.array_task_id}"
        return self.job_id

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


def parse_jobs(output: bytes | str, local_tz: timezone | None = None) -> list[Job]:
    """Parse ``squeue -h -O <format_arg(JOB_FIELDS, JOB_TEXT_FIELDS)>`` output; a record whose ids,
    state or nodes are not Slurm's is refused (one log line each), the others are kept."""
    jobs = []
    widths = [w for _, w in JOB_TEXT_FIELDS]
    for raw in frame(output, len(JOB_FIELDS), widths):
        cols = [decode(c) for c in raw]
        try:
            jobs.append(job_record(cols, local_tz))
        except (ValueError, UsageError) as exc:
            log.warning("squeue record refused: %s", exc)
    return jobs


def job_record(cols: Sequence[str], local_tz: timezone | None = None) -> Job:
    """One job from its fields as ``squeue`` prints them (JOB_FIELDS, then JOB_TEXT_FIELDS): the CLI and
    the pyslurm backend both build their records here. ValueError or UsageError when they are not a job's."""
    (jid, ajid, atid, state, nodelist, restarts, user, part, nnodes, start, submit, eligible) = (
        c.strip() for c in cols[: len(JOB_FIELDS)]
    )
    reason, feature, name, comment = cols[len(JOB_FIELDS) :]
    if not ids.is_job_id(jid):
        raise ValueError(f"job id {ids.shorten(jid)}")
    is_array = clean_text(atid) != ""
    if is_array and not ids.is_job_id(ajid):
        raise ValueError(f"array job id {ids.shorten(ajid)} of job {jid}")
    if not (state.isascii() and state.replace("_", "").isalpha()):
        raise ValueError(f"state {ids.shorten(state)} of job {jid}")
    nodes = tuple(expand_nodes(nodelist)) if clean_text(nodelist) else ()
    for node in nodes:
        ids.node_name(node)
    return Job(
        job_id=jid,
        state=state.upper(),
        reason=clean_text(reason),
        nodes=nodes,
        restart_count=to_int(restarts),
        user=user,
        name=name.rstrip(" "),
        partition=part,
        num_nodes=to_int(nnodes),
        start_time=parse_time(start, local_tz),
        submit_time=parse_time(submit, local_tz),
        eligible_time=parse_time(eligible, local_tz),
        features=clean_text(feature),
        comment=clean_text(comment.rstrip(" ")),
        array_job_id=ajid if is_array else "",
        array_task_id=clean_text(atid) if is_array else "",
    )


def parse_config(output: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = value`` lines, same on 22.05 to 26.05) -> {key: value}."""
    found = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found[key.strip()] = value.strip()
    return found


def scheduler_parameters(config: dict[str, str], key: str = "SchedulerParameters") -> dict[str, str]:
    """``SchedulerParameters`` (or another comma-separated option list such as ``SlurmctldParameters``)
    as {option: value} (``bf_continue`` -> ``""``)."""
    text = clean_text(config.get(key, ""))
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
