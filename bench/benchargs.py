"""The command line of a bench that takes only ``--quick``: ``--help`` prints its docstring and exits,
an unknown option is one line and exit 2 (a bench never starts on a typo or a request for help)."""

from __future__ import annotations

import argparse


def parser(doc: str | None) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--quick", action="store_true", help="fewer rounds and smaller sizes")
    return made


def quick(doc: str | None, argv: list[str] | None = None) -> bool:
    """True with ``--quick``."""
    return parser(doc).parse_args(argv).quick
