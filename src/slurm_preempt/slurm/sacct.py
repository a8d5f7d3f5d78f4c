"""``sacct`` rows: one typed record per attempt of a job, and the pure parser that builds them.

Tested on output captured from real Slurm (tests/data/); ``commands.Slurm.accounting`` runs sacct.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone

from slurm_preempt import ids
from slurm_preempt.errors import UsageError
from slurm_preempt.slurm.parse import clean_text, decode, expand_nodes, parse_time, to_int

log = logging.getLogger(__name__)

# `sacct -P` uses "|" and quotes nothing: no field asked for here is free text (no job name, no comment).
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
        return to_int(self.alloc_tres.get("gres/gpu", "0"))

    @property
    def cpus(self) -> int:
        return to_int(self.alloc_tres.get("cpu", "0"))


def parse_acct(output: bytes | str, local_tz: timezone | None = None) -> list[AcctRecord]:
    """Parse ``sacct -n -P -X -D --format=<ACCT_FIELDS>`` output; rows that are not a job are skipped."""
    text = decode(output) if isinstance(output, bytes) else output
    rows = []
    for line in text.split("\n"):
        cols = line.split("|")
        if len(cols) < len(ACCT_FIELDS) or not ids.is_job_id(cols[0].strip()):
            continue
        try:
            rows.append(_acct_row(cols, local_tz))
        except (ValueError, UsageError) as exc:
            log.warning("sacct row refused: %s", exc)
    return rows


def _acct_row(cols: list[str], local_tz: timezone | None) -> AcctRecord:
    raw, jid, state, exit_code, submit, start, end, nnodes, nodelist, part, user, cons, tres = cols[
        : len(ACCT_FIELDS)
    ]
    # "CANCELLED by 0" -> CANCELLED
    state = state.split()[0].upper() if state.strip() else "UNKNOWN"
    tres_map = dict(kv.split("=", 1) for kv in tres.split(",") if "=" in kv)
    return AcctRecord(
        job_id=raw.strip(),
        display_id=jid.strip(),
        state=state,
        exit_code=exit_code.strip(),
        submit=parse_time(submit, local_tz),
        start=parse_time(start, local_tz),
        end=parse_time(end, local_tz),
        num_nodes=to_int(nnodes),
        nodes=tuple(expand_nodes(nodelist)) if clean_text(nodelist) else (),
        partition=part.strip(),
        user=user.strip(),
        constraints=clean_text(cons),
        alloc_tres=tres_map,
    )
