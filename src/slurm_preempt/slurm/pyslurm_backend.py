"""The watcher's poll reads (nodes, jobs) through pyslurm, Slurm's C API, instead of ``sinfo``/``squeue``.

Optional: ``pyslurm`` is imported here only, when the backend is chosen (``[watch] backend``), never on
import of the package. pyslurm is built against one Slurm release's libslurm and speaks that release's
RPCs, so it is used only when its major release (``25.11`` of ``25.11.2``) is the running controller's
(``scontrol show config``: SLURM_VERSION); otherwise the CLI is kept, and the log says why, once.

Writes (signals, requeue, updates) stay on the CLI: ``PyslurmSlurm`` is a ``commands.Slurm`` whose two
reads are replaced. Every record is built by the same functions as the CLI's (``parse.node_record``,
``parse.job_record``) from the fields ``sinfo``/``squeue`` would print, the user's text cut at the
widths the CLI asks for, so both backends give the same records and the same decisions.

Hostile text: pyslurm turns a C string into ``str`` with strict UTF-8 (Cython's
``c_string_encoding=default``), so a job name, comment or reason holding invalid UTF-8 raises
``UnicodeDecodeError`` when the attribute is read (checked on 25.11.2). Such a record is read again
through the CLI, which frames its bytes and decodes them with replacement: one bad record neither stops
the poll nor differs between backends. Nothing a user writes is looked at as structure here either:
the values arrive as separate fields of a C struct.

Job states: squeue's ``-t running`` compares a state word with the job's base state (or its flag, for
a flag word such as ``configuring``), while pyslurm gives only the string Slurm prints, where a flag
wins over the base (``CONFIGURING`` for a running job still booting). ``_BASE_OF_FLAG`` gives the base
Slurm sets with each flag (slurm_protocol_defs.c ``job_state_string``; slurmctld sets them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_preempt import ids
from slurm_preempt.errors import SlurmError, UsageError
from slurm_preempt.slurm import parse
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import Job, Node

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cli", "pyslurm")
# The widths the CLI asks for (parse.*_TEXT_FIELDS): a longer value is cut there by both backends.
_JOB_WIDTHS = dict(parse.JOB_TEXT_FIELDS)
_NODE_WIDTHS = dict(parse.NODE_TEXT_FIELDS)
# A job's state string when a flag is set, and the base state Slurm has under it (what `squeue -t`
# compares a base word with). COMPLETING, STAGE_OUT and REQUEUED sit on an ended job's base.
_BASE_OF_FLAG = {
    "CONFIGURING": "RUNNING",
    "RESIZING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STOPPED": "RUNNING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "SPECIAL_EXIT": "PENDING",
}
_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
          "DEADLINE", "OUT_OF_MEMORY", "STAGE_OUT", "REQUEUED"}  # fmt: skip


def _text(value: Any) -> str:
    """A pyslurm value as the CLI prints it: None is empty, lists are comma-joined."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def fit(value: Any, width: int) -> str:
    """The user's text as the CLI's fixed-width field holds it: its first ``width`` bytes, a character
    cut in two replaced, as ``parse`` decodes it."""
    return _text(value).encode("utf-8", "surrogateescape")[:width].decode("utf-8", "replace")


def node_fields(node: Any) -> list[str]:
    """The fields ``sinfo -O`` prints (parse.NODE_FIELDS, NODE_TEXT_FIELDS) of one ``pyslurm.Node``.
    UnicodeDecodeError when pyslurm cannot decode one of them."""
    return [_text(node.name), _text(node.state), _text(node.available_features), _text(node.reason_time),
            _text(node.reason_user), fit(node.reason, _NODE_WIDTHS["Reason"])]  # fmt: skip


def job_fields(job: Any) -> list[str]:
    """The fields ``squeue -O`` prints (parse.JOB_FIELDS, JOB_TEXT_FIELDS) of one ``pyslurm.Job``.
    An array task has its array's id and its task id; a job outside an array has neither."""
    task = job.array_task_id
    array_id = _text(job.array_id) if task is not None else _text(job.id)
    return [
        _text(job.id), array_id, _text(task), _text(job.state), _text(job.allocated_nodes),
        _text(job.requeue_count), _text(job.user_name), _text(job.partition), _text(job.num_nodes),
        _text(job.start_time), _text(job.submit_time), _text(job.eligible_time),
        fit(job.state_reason, _JOB_WIDTHS["Reason"]), fit(job.constraints, _JOB_WIDTHS["Feature"]),
        fit(job.name, _JOB_WIDTHS["Name"]), fit(job.comment, _JOB_WIDTHS["Comment"]),
    ]  # fmt: skip


def node_matches(node: Node, states: str | None) -> bool:
    """``sinfo -t``: ``drain`` is any drain flag (draining or drained), other words a base state or
    a flag."""
    if not states:
        return True
    for word in (w.strip().upper() for w in states.split(",") if w.strip()):
        if word == "DRAIN" and node.drain or word == "DOWN" and node.down:
            return True
        if word == node.state or word in node.flags:
            return True
    return False


def job_matches(job: Job, states: str | None, default_alive: bool) -> bool:
    """``squeue -t``: a word names the job's base state or its flag; ``all`` every job. With no
    states, squeue leaves out ended jobs (unless it was given job ids: ``default_alive`` False)."""
    base = _BASE_OF_FLAG.get(job.state, job.state)
    if not states:
        return not (default_alive and base in _ENDED)
    words = {w.strip().upper() for w in states.split(",") if w.strip()}
    return "ALL" in words or job.state in words or base in words


@dataclass
class PyslurmSlurm(Slurm):
    """``commands.Slurm`` whose watcher reads go through pyslurm; everything else is the CLI's."""

    module: Any = field(default=None, repr=False)  # the imported pyslurm

    def nodes(
        self, names: Iterable[str] | None = None, states: str | None = None, partition: str | None = None
    ) -> list[Node]:
        wanted = set(names) if names else None
        loaded = self._load(lambda: self.module.Nodes.load())
        found: list[Node] = []
        unread: list[str] = []
        for node in loaded.values():
            try:
                record = parse.node_record(node_fields(node))
            except UnicodeDecodeError:
                unread.append(_safe_name(node))
                continue
            except ValueError as exc:
                log.warning("pyslurm node refused: %s", exc)
                continue
            in_partition = not partition or partition in (getattr(node, "partitions", None) or ())
            if (wanted is None or record.name in wanted) and in_partition and node_matches(record, states):
                found.append(record)
        unread = [n for n in unread if n and (wanted is None or n in wanted)]
        if unread:  # the CLI decodes what pyslurm could not; a name it cannot tell is refused
            found += Slurm.nodes(self, names=unread, states=states, partition=partition)
        return found

    def jobs(
        self,
        job_ids: Iterable[str] | None = None,
        nodes: Iterable[str] | None = None,
        states: str | None = None,
        user: str | None = None,
    ) -> list[Job]:
        wanted = set(_job_names(job_ids or []))
        on_nodes = set(nodes) if nodes else None
        loaded = self._load(lambda: self.module.Jobs.load())
        found: list[Job] = []
        unread: list[str] = []
        for job in loaded.values():
            try:
                record = parse.job_record(job_fields(job))
            except UnicodeDecodeError:
                unread.append(str(job.id))
                continue
            except (ValueError, UsageError) as exc:
                log.warning("pyslurm job refused: %s", exc)
                continue
            if _job_wanted(record, wanted, on_nodes, states, user):
                found.append(record)
        if unread:  # read again through the CLI, with the same filters
            again = Slurm.jobs(self, job_ids=unread, states=states or "all")
            found += [j for j in again if _job_wanted(j, wanted, on_nodes, states, user)]
        return found

    def _load(self, loader: Callable[[], Any]) -> Any:
        """pyslurm's answer; its RPC errors become SlurmError (the poll is retried, as with the CLI)."""
        try:
            return loader()
        except Exception as exc:  # pyslurm.RPCError and whatever libslurm raises through it
            raise SlurmError(["pyslurm"], None, f"{type(exc).__name__}: {exc}") from None


def _job_names(job_ids: Iterable[str]) -> list[str]:
    names = [str(j) for j in job_ids]
    bad = [j for j in names if not ids.is_job_name(j)]
    if bad:
        raise UsageError(f"not a Slurm job id: {ids.shorten(bad[0])}")
    return names


def _job_wanted(job: Job, wanted: set[str], on_nodes: set[str] | None, states: str | None,
                user: str | None) -> bool:  # fmt: skip
    if wanted and not wanted & {job.job_id, job.display_id, job.array_job_id}:
        return False
    if on_nodes is not None and not on_nodes.intersection(job.nodes):
        return False
    if user is not None and job.user != user:
        return False
    return job_matches(job, states, default_alive=not wanted)


def _safe_name(node: Any) -> str:
    try:
        return _text(node.name)
    except UnicodeDecodeError:
        log.warning("pyslurm node refused: its name is not UTF-8")
        return ""


# ---------------------------------------------------------------------------------------- choosing


def major(version: str) -> tuple[int, int] | None:
    """``25.11.2`` -> (25, 11); None when it is not a release number."""
    parts = version.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def choose(backend: str, cli: Slurm, importer: Callable[[], Any] | None = None) -> Slurm:
    """The watcher's Slurm for ``[watch] backend``, chosen once and logged: ``cli``; ``pyslurm`` when it
    imports and its major release is the controller's, else the CLI and why (a warning: it was asked
    for). ``auto`` is pyslurm when it can be, quietly the CLI otherwise: bench/bench_pyslurm.py measured
    the poll's reads through pyslurm at 0.2 of the CLI's time on a 25.11 cluster."""
    if backend == "cli":
        log.info("watcher reads Slurm through its commands (backend = cli)")
        return cli
    why, module = _usable(cli, importer or _import)
    if module is None:
        say = log.warning if backend == "pyslurm" else log.info
        say("backend = %s, but %s: reading Slurm through its commands", backend, why)
        return cli
    log.info(
        "watcher reads Slurm through pyslurm %s (%s); writes through its commands", module.__version__, why
    )
    return PyslurmSlurm(timeout=cli.timeout, env=cli.env, cwd=cli.cwd, module=module)


def _import() -> Any:
    import pyslurm  # type: ignore[import-not-found]  # optional: the [pyslurm] extra

    return pyslurm


def _usable(cli: Slurm, importer: Callable[[], Any]) -> tuple[str, Any]:
    try:
        module = importer()
    except Exception as exc:  # ImportError, or libslurm's symbols missing (an OSError)
        return f"pyslurm does not import ({type(exc).__name__}: {exc})", None
    ours = major(str(getattr(module, "__version__", "")))
    try:
        running_text = cli.config().get("SLURM_VERSION", "")
    except SlurmError as exc:
        return f"the controller's version is unknown ({exc})", None
    running = major(running_text)
    if ours is None or ours != running:
        return (
            f"pyslurm {getattr(module, '__version__', '?')} is not for the running Slurm {running_text}",
            None,
        )
    return f"Slurm {running_text}", module


__all__: Sequence[str] = ("BACKENDS", "PyslurmSlurm", "choose", "fit", "job_fields", "node_fields")
