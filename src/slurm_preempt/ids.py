"""What a Slurm job id, array task id and node name look like: checked before any of them reaches the
argv of a Slurm command or a path.

Anything read from Slurm's output or from a provider's API is checked here first, because a cluster
user writes parts of that output (job names and comments are printed raw, bytes of any value) and a
provider's API is another party's. A value that does not have the shape is refused, never cleaned:
cleaning ``../1`` into ``1`` would act on someone else's job.

ASCII only on purpose: ``str.isdigit()`` is true for ``²`` and ``٣``, which no Slurm id contains and
``int()`` may refuse. Import-light: standard library only (the job side and the hooks' readers use it).
"""

from __future__ import annotations

import re

# A job's unique id (``SLURM_JOB_ID``) and an array task as ``A_T``: both are what scancel, scontrol and
# squeue -j accept for exactly one job. Slurm ids are 32-bit numbers: 10 digits at most.
_JOB_ID = re.compile(r"[0-9]{1,10}")
_TASK_ID = re.compile(r"[0-9]{1,10}_[0-9]{1,10}")
# Node names as Slurm and hostnames have them: letters, digits, ``-``, ``_``, ``.``; never a bracket,
# a comma or a space (those make a host list), never a leading ``-`` (an option to a command).
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def is_job_id(text: object) -> bool:
    """``123``: a job's unique id."""
    return isinstance(text, str) and _JOB_ID.fullmatch(text) is not None


def is_job_name(text: object) -> bool:
    """``123`` or ``123_4``: what names exactly one job (an array task by its array's id and index)."""
    return isinstance(text, str) and (_JOB_ID.fullmatch(text) or _TASK_ID.fullmatch(text)) is not None


def is_node_name(text: object) -> bool:
    return isinstance(text, str) and _NODE.fullmatch(text) is not None


def job_id(text: object) -> str:
    """``text`` when it is a job id or ``A_T``; ValueError (naming it, shortened) otherwise."""
    if not is_job_name(text):
        raise ValueError(f"not a Slurm job id: {shorten(text)}")
    return str(text)


def node_name(text: object) -> str:
    if not is_node_name(text):
        raise ValueError(f"not a Slurm node name: {shorten(text)}")
    return str(text)


def shorten(value: object, limit: int = 40) -> str:
    """A value for one log line: repr'd (control bytes escaped) and cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
