"""Output helpers shared by the commands: JSON for scripts, plain lines for people."""

from __future__ import annotations

import json
from datetime import datetime

import click


def _default(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if hasattr(value, "__fspath__"):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=_default, sort_keys=False))


def json_option(func):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(func)
