"""A class's public surface, as the class has it and as docs/resume.md lists it, for the tests that hold
the two together (test_resume.py: Run; test_checkpoint.py: CheckpointStore)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "resume.md"
KINDS = ("constructor", "methods", "read-only properties")


def actual(cls: type) -> dict[str, list[str]]:
    """Public constructor parameters, methods and properties of ``cls`` (leading ``_``: internal)."""
    params = [n for n in inspect.signature(cls.__init__).parameters if n != "self" and not n.startswith("_")]
    public = {n: v for n, v in vars(cls).items() if not n.startswith("_")}
    return {
        "constructor": params,
        "methods": sorted(n for n, v in public.items() if inspect.isfunction(v)),
        "read-only properties": sorted(n for n, v in public.items() if isinstance(v, property)),
    }


def documented(heading: str) -> dict[str, list[str]]:
    """The names in each row of the table under ``### <heading>`` (rows: kind | `name`, `name`...)."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(f"### {heading}")
    rows: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 2 and cells[0] not in ("kind", "---"):
            kind = cells[0].split(" (")[0]
            # A deprecated name is followed by what replaces it, in parentheses: "`old` (`new`)".
            names = r"`(\w+)` \(" if kind == "deprecated" else r"`(\w+)`"
            rows[kind] = re.findall(names, cells[1])
    return rows
