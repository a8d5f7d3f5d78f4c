"""Validated options of ``slurm-preempt sbatch``: every value that reaches a job script passes here.

Two rules keep a generated script honest. A value that becomes an ``#SBATCH`` line must be one safe
line (no newline, NUL or other control character, and no ``hetjob``/``packjob``, words Slurm reads as
a separator of heterogeneous job components anywhere on an ``#SBATCH`` line); it is then quoted for
sbatch's own line parser by :func:`sbatch_quote`. A value that reaches the shell is quoted by
``shlex.quote`` in the templates. Nothing is quoted by hand.
"""

from __future__ import annotations

import re
from typing import Any

from slurm_preempt.errors import UsageError
from slurm_preempt.optin import normalize_signal

BUILTIN_TEMPLATES = ("plain", "torchrun", "array")
NOTICE_SIGNALS = ("USR1", "USR2")  # the watcher's signal: one the batch shell traps, never one that stops
FORWARD_SIGNALS = ("TERM", "INT", "USR1", "USR2", "HUP")
MAX_VALUE_LENGTH = 4096

# sbatch 22.05/24.11 long options (sbatch --help). The pass-through accepts these, minus OWNED.
SBATCH_OPTIONS = frozenset(
    """account array bb bbf begin chdir cluster-constraint clusters comment constraint container
    contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot
    dependency distribution error exclude exclusive export export-file extra-node-info get-user-env gid
    gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hold
    ignore-pbs input job-name licenses mail-type mail-user mcs-label mem mem-per-cpu mem-per-gpu mincpus
    nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-node
    ntasks-per-socket output overcommit oversubscribe parsable partition power priority profile propagate
    qos quiet reboot requeue reservation signal sockets-per-node spread-job switches thread-spec
    threads-per-core time time-min tmp uid usage use-min-nodes verbose version wait wckey wrap
    container-id extra tres-per-task""".split()  # noqa: SIM905 - a readable word list
)
# Options the generator sets itself (use the dedicated option) or that make no sense in a script.
OWNED = {
    "array": "--array",
    "chdir": "--chdir",
    "comment": "--comment",
    "constraint": "--constraint or --standard",
    "cpus-per-task": "--cpus-per-task",
    "error": "--error",
    "gpus-per-node": "--gpus-per-node",
    "gres": "--gres",
    "job-name": "--job-name",
    "mail-type": "--mail-type",
    "mail-user": "--mail-user",
    "mem": "--mem",
    "nodes": "--nodes",
    "ntasks-per-node": "--ntasks-per-node",
    "output": "--output",
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "time": "--time",
    "signal": "--timelimit-notice",
    "open-mode": None,
    "requeue": None,
    "no-requeue": None,
    "uid": None,
    "gid": None,
    "wrap": None,
    "parsable": None,
    "help": None,
    "usage": None,
    "version": None,
    "wait": None,
}
MAIL_TYPES = frozenset(
    """NONE BEGIN END FAIL REQUEUE ALL INVALID_DEPEND STAGE_OUT TIME_LIMIT TIME_LIMIT_90
    TIME_LIMIT_80 TIME_LIMIT_50 ARRAY_TASKS""".split()  # noqa: SIM905
)
_SLURM_SEPARATORS = ("hetjob", "packjob")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.\-&|\[\]*():!,]+$")
MEM_RE = re.compile(r"^[0-9]+[KMGT]?$", re.IGNORECASE)
GPUS_RE = re.compile(r"^([A-Za-z0-9_.\-]+:)?[0-9]+$")
GRES_RE = re.compile(r"^[A-Za-z0-9_.\-:,=]+$")
ARRAY_RE = re.compile(r"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?$")
PLAIN_WORD_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


# ------------------------------------------------------------------------------------------ checks


def check_line(what: str, value: Any, directive: bool = True) -> str:
    """``value`` as one safe line (for an ``#SBATCH`` directive unless ``directive`` is False)."""
    text = str(value)
    if text == "":
        raise UsageError(f"{what} is empty")
    if "\n" in text or "\r" in text:
        raise UsageError(f"{what} must be one line, got a newline in {text!r}")
    if "\x00" in text:
        raise UsageError(f"{what} contains a NUL character")
    if not text.isprintable():
        raise UsageError(f"{what} contains a control character: {text!r}")
    if len(text) > MAX_VALUE_LENGTH:
        raise UsageError(f"{what} is longer than {MAX_VALUE_LENGTH} characters")
    lowered = text.lower() if directive else ""
    for word in _SLURM_SEPARATORS:
        if word in lowered:
            raise UsageError(f"{what} may not contain {word!r}: Slurm reads it as a job separator")
    return text


def check_arg(what: str, value: str) -> str:
    """A value handed to the shell (quoted there): anything but NUL, which no argv can hold."""
    if "\x00" in value:
        raise UsageError(f"{what} contains a NUL character, which no command argument can hold")
    return value


def sbatch_quote(value: str) -> str:
    """Quote a checked value for sbatch's ``#SBATCH`` line parser (double quotes, backslash escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_nodes(text: str) -> str:
    """``N`` or ``MIN-MAX`` with 1 <= MIN <= MAX."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", str(text))
    if not match:
        raise UsageError(f"--nodes {text!r}: give N or MIN-MAX, e.g. 2 or 2-4")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) else low
    if low < 1:
        raise UsageError(f"--nodes {text}: a job needs at least 1 node")
    if high < low:
        raise UsageError(f"--nodes {text}: MIN is larger than MAX (did you mean {high}-{low}?)")
    return f"{low}-{high}" if match.group(2) else str(low)


def parse_time(text: str) -> int | None:
    """Seconds in a Slurm time limit (None for UNLIMITED); UsageError on a bad field."""
    raw = str(text).strip()
    if raw.upper() in ("UNLIMITED", "INFINITE"):
        return None
    hint = "use MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    match = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?", raw)
    if not match:
        raise UsageError(f"--time {text!r} is not a Slurm time: {hint}")
    days, first, second, third = match.groups()
    parts: list[tuple[str, str | None, int | None]]  # (unit name, digits, exclusive upper limit)
    unit: tuple[int, ...]
    if days is not None:  # D-HH[:MM[:SS]]
        parts = [("hours", first, 24), ("minutes", second, 60), ("seconds", third, 60)]
        total = int(days) * 86400
        unit = (3600, 60, 1)
    elif third is not None:  # HH:MM:SS
        parts = [("hours", first, None), ("minutes", second, 60), ("seconds", third, 60)]
        total, unit = 0, (3600, 60, 1)
    elif second is not None:  # MM:SS
        parts = [("minutes", first, None), ("seconds", second, 60)]
        total, unit = 0, (60, 1)
    else:  # MINUTES
        parts, total, unit = [("minutes", first, None)], 0, (60,)
    for (name, value, limit), scale in zip(parts, unit, strict=True):
        if value is None:
            continue
        if limit is not None and int(value) >= limit:
            raise UsageError(f"--time {text}: {int(value)} {name} is out of range (0-{limit - 1}); {hint}")
        total += int(value) * scale
    if total <= 0:
        raise UsageError(f"--time {text}: a time limit must be positive")
    return total


def parse_signal(option: str, value: str, allowed: tuple[str, ...]) -> str | None:
    """``USR1``/``SIGUSR1``/``none`` -> ``USR1`` or None, limited to ``allowed``."""
    try:
        name = normalize_signal(str(value))
    except ValueError:
        name = "?"
    if name is not None and name not in allowed:
        raise UsageError(f"{option} {value!r}: choose one of {', '.join(allowed)} or none")
    return name


def positive_int(option: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UsageError(f"{option} {value!r} is not a whole number") from None
    if number < minimum or (maximum is not None and number > maximum):
        upper = f"-{maximum}" if maximum is not None else " or more"
        raise UsageError(f"{option} {value}: must be {minimum}{upper}")
    return number


def parse_passthrough(text: str) -> tuple[str, str | None]:
    """``--opt`` or ``--opt=value`` for any sbatch option the generator does not own."""
    raw = check_line("--sbatch", text).lstrip()
    if not raw.startswith("--"):
        raise UsageError(f"--sbatch {raw!r}: give a long sbatch option, e.g. --sbatch=--exclusive")
    name, sep, value = raw[2:].partition("=")
    name = name.rstrip()
    if name not in SBATCH_OPTIONS and name != "open-mode":
        raise UsageError(f"--sbatch {raw!r}: --{name} is not an sbatch option")
    if name in OWNED:
        instead = OWNED[name]
        tail = f"; use {instead}" if instead else ""
        raise UsageError(f"--sbatch {raw!r}: --{name} is set by slurm-preempt sbatch{tail}")
    if sep and not value.strip():
        raise UsageError(f"--sbatch {raw!r}: --{name}= needs a value")
    return name, (value if sep else None)


def parse_env(text: str) -> tuple[str, str]:
    name, sep, value = str(text).partition("=")
    if not sep or not _ENV_NAME.fullmatch(name):  # fullmatch: `$` alone matches before a final newline
        raise UsageError(f"--env {text!r}: give NAME=VALUE with NAME made of letters, digits and _")
    if name.startswith("SLURM_PREEMPT_"):
        raise UsageError(f"--env {name}: SLURM_PREEMPT_* variables are set by the script itself")
    return name, check_arg(f"--env {name}", value)


def check_pattern(option: str, value: Any, pattern: re.Pattern, example: str) -> str:
    text = check_line(option, value).strip()
    if not pattern.fullmatch(text):
        raise UsageError(f"{option} {text!r} is not valid, e.g. {example}")
    return text


def check_mail_type(value: str) -> str:
    text = check_line("--mail-type", value).upper()
    bad = [t for t in text.split(",") if t not in MAIL_TYPES]
    if bad:
        raise UsageError(f"--mail-type {value!r}: unknown {', '.join(bad)} (e.g. END,FAIL,REQUEUE)")
    return text
