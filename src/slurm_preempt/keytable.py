"""A config section's keys, declared once: the settings dataclass is the table.

Each field of a section's frozen dataclass is declared with ``key(default, convert, doc)``: its name
is the config key, its annotation the type, ``convert`` turns a TOML value into it or raises
ValueError saying why (the validation), ``doc`` is the one line of the docs. From that one declaration
come the defaults (the dataclass's own), reading a section (``read``), the ``DEFAULTS`` views and
the docs' key tables (``markdown``; ``python -m slurm_preempt.cli.reference`` writes them into
docs/watcher.md, docs/resume.md and docs/report.md, and a test fails when a page differs). The
``[sbatch]`` keys are declared with the command line's options instead (``sbatch/optiontable.py``).

What a bad value does is the section's choice: ``[watch]`` and ``[report]`` refuse it at start,
``[resume]`` warns and keeps the default (a job must run under any configuration). Nothing but the
standard library and ``errors``: the job side imports this.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from slurm_preempt.errors import ConfigError

T = TypeVar("T")
_KEY = "slurm_preempt.key"


@dataclass(frozen=True)
class Key:
    """One declared key, as read back from its dataclass field."""

    name: str
    default: Any
    convert: Callable[[Any], Any]
    doc: str
    shown: str  # the default as the docs write it

    def toml(self) -> Any:
        """The default as a config file would hold it (lists, not tuples)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default


@dataclass(frozen=True)
class Problem:
    """A key of a section that cannot be used: unknown (``why`` empty) or a bad value."""

    key: str
    value: Any
    why: str = ""

    def says(self, section: str, where: str = "") -> str:
        place = f" in {where}" if where else ""
        if not self.why:
            return f"unknown key [{section}] {self.key}{place}"
        return f"[{section}] {self.key} = {self.value!r}{place}: {self.why}"


def key(default: T, convert: Callable[[Any], T], doc: str, *, shown: str | None = None) -> T:
    """A dataclass field that is a config key. ``shown``: the default in the docs' words (else the
    value, as :func:`shown_default` writes it)."""
    described = (convert, doc, shown if shown is not None else shown_default(default))
    return field(default=default, metadata={_KEY: described})


def keys(section: type) -> tuple[Key, ...]:
    """The keys a section's dataclass declares, in their order."""
    found = []
    for f in fields(section):
        if _KEY in f.metadata:
            convert, doc, shown = f.metadata[_KEY]
            default = None if f.default is MISSING else f.default
            found.append(Key(f.name, default, convert, doc, shown))
    return tuple(found)


def defaults(section: type) -> dict[str, Any]:
    return {k.name: k.toml() for k in keys(section)}


def read(section: type, table: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """Every key of ``table`` the section declares, converted; what cannot be used, as problems (in
    the table's order). ``None`` means "not given" (a command-line option left out)."""
    known = {k.name: k for k in keys(section)}
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for name, value in table.items():
        if value is None:
            continue
        if name not in known:
            problems.append(Problem(name, value))
            continue
        try:
            values[name] = known[name].convert(value)
        except ValueError as exc:
            problems.append(Problem(name, value, str(exc)))
    return values, problems


def refuse(section: str, declared: type, problems: list[Problem], where: str = "") -> None:
    """For a section that refuses what it cannot use: the problems as one ConfigError line."""
    unknown = sorted(p.key for p in problems if not p.why)
    if unknown:
        place = f" in {where}" if where else ""
        known = ", ".join(k.name for k in keys(declared))
        raise ConfigError(f"[{section}] unknown key(s){place}: {', '.join(unknown)}; known: {known}")
    if problems:
        raise ConfigError(problems[0].says(section, where))


# ---------------------------------------------------------------------------------------- the docs


def shown_default(value: Any) -> str:
    """``true``, ``5``, `` `preemptible` ``, `` `["USR1", "TERM"]` ``, unset; an empty text shows
    nothing."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return f"`{json.dumps(list(value))}`"
    return f"`{value}`" if value else ""


def markdown(section: type) -> str:
    """The key table of a section's docs: one row per key, in declaration order."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for k in keys(section):
        cells = (f"`{k.name}`", _cell(k.shown), _cell(k.doc))
        rows.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n".join(rows) + "\n"


def _cell(words: str) -> str:
    return " ".join(words.split()).replace("|", "\\|")


# ---------------------------------------------------------------------------------------- conversions
# Each takes a value as TOML gives it and returns it typed, or raises ValueError saying what it is not.


def seconds(*, positive: bool = False) -> Callable[[Any], float]:
    """A finite number of seconds, >= 0 (``positive``: > 0). nan polled in a busy loop, inf crashed
    a wait."""

    def convert(value: Any) -> float:
        bound = "> 0" if positive else ">= 0"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"not a number of seconds {bound}")
        if not math.isfinite(value):
            raise ValueError("not a finite number of seconds")
        if value < 0 or (positive and value == 0):
            raise ValueError(f"not a number of seconds {bound}")
        return float(value)

    return convert


def whole(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"not a whole number >= {minimum}")
        return value

    return convert


def number(low: float, high: float = math.inf) -> Callable[[Any], float]:
    """A finite number from ``low`` to ``high``."""

    def convert(value: Any) -> float:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not ok or not low <= value <= high:
            upper = f" and <= {high:g}" if math.isfinite(high) else ""
            raise ValueError(f"not a number >= {low:g}{upper}")
        return float(value)

    return convert


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("not true or false")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not a string")
    return value


def texts(value: Any) -> tuple[str, ...]:
    """A list of strings; one string is a list of one."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise ValueError("not a list of strings")
    return tuple(items)
