"""The reference pages, written from the code that holds each fact: ``docs/cli.md`` from the click
commands themselves, the option table of ``docs/sbatch.md`` from ``sbatch.optiontable``, and the key
tables of the ``[watch]``, ``[resume]`` and ``[report]`` sections (docs/watcher.md, docs/resume.md,
docs/report.md) from their declarations (``keytable``).

    python -m slurm_preempt.cli.reference            # rewrite them (run from the repository's root)
    python -m slurm_preempt.cli.reference --check    # exit 1 when a committed page differs

tests/test_docs.py fails when the committed pages differ from what this writes today, so a changed
option, help text or example forces a regenerated page.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from slurm_preempt import keytable
from slurm_preempt.cli import main
from slurm_preempt.job.settings import ResumeSettings
from slurm_preempt.records.prices import ReportSettings
from slurm_preempt.sbatch import optiontable
from slurm_preempt.watch.settings import Settings as WatchSettings

PROGRAM = "slurm-preempt"
CLI_PAGE = Path("docs/cli.md")
SBATCH_PAGE = Path("docs/sbatch.md")
BEGIN = (
    "<!-- BEGIN options: written by `python -m slurm_preempt.cli.reference` from sbatch/optiontable.py -->"
)
END = "<!-- END options -->"
# Each config section's key table: the page it is in, and the declaration it is written from.
KEY_TABLES = (
    ("watch", Path("docs/watcher.md"), WatchSettings, "watch/settings.py"),
    ("resume", Path("docs/resume.md"), ResumeSettings, "job/settings.py"),
    ("report", Path("docs/report.md"), ReportSettings, "records/prices.py"),
)


def commands(
    command: click.Command = main, ctx: click.Context | None = None
) -> Iterator[tuple[click.Command, click.Context]]:
    """Every command and subcommand with its context, depth first, in the order ``--help`` lists them."""
    ctx = ctx or click.Context(command, info_name=PROGRAM, **command.context_settings)
    yield command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from commands(
                    sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings)
                )


def _listed(param: click.Parameter, ctx: click.Context) -> bool:
    """Options, but not -h/--help (every command has it; said once at the top). Arguments show in the
    usage line."""
    if not isinstance(param, click.Option):
        return False
    return param.expose_value or set(param.opts) != set(ctx.help_option_names)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _prose(text: str) -> list[str]:
    """Click help text as markdown: paragraphs joined to one line each, ``\\b`` blocks (examples) kept
    verbatim as bash code blocks."""
    out: list[str] = []
    for paragraph in inspect.cleandoc(text.split("\f", maxsplit=1)[0]).split("\n\n"):
        if paragraph.startswith("\b\n"):
            head, *lines = paragraph[2:].split("\n")
            out += [head.strip(), "", "```bash", *_dedent(lines), "```", ""]
        elif paragraph.strip():
            out += [" ".join(paragraph.split()), ""]
    return out


def _dedent(lines: list[str]) -> list[str]:
    margin = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[margin:].rstrip() for x in lines]


def command_section(command: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    out = [f"## `{path}`", "", "```", " ".join([path, *command.collect_usage_pieces(ctx)]), "```", ""]
    out += _prose(command.help or "")
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx) if _listed(param, ctx) else None
        if record is not None:
            rows.append(f"| `{_cell(record[0])}` | {_cell(record[1])} |")
    if isinstance(command, click.Group):
        subs = [(n, command.get_command(ctx, n)) for n in command.list_commands(ctx)]
        listed = [
            f"| [`{n}`](#{_anchor(f'{path} {n}')}) | {_cell(c.get_short_help_str(200))} |"
            for n, c in subs
            if c
        ]
        out += ["| command | what it does |", "|---|---|", *listed, ""]
    if rows:
        out += ["| option | what it does |", "|---|---|", *rows, ""]
    if command.epilog:
        out += _prose(command.epilog)
    return out


def _anchor(title: str) -> str:
    """GitHub's anchor of a ``## `title` `` heading."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def cli_page() -> str:
    found = list(commands())
    lines = [
        "# Command-line reference",
        "",
        "<!-- Written by `python -m slurm_preempt.cli.reference` from the click commands; do not edit by",
        "hand: change the command's options or help and run it again (tests/test_docs.py checks). -->",
        "",
        "Every command and subcommand of `slurm-preempt`, with every option and the command's own",
        "example, as `--help` shows them. Every command takes `-h`/`--help`. The guides say more:",
        "[sbatch](sbatch.md), [resume](resume.md), [watch](watcher.md), [hooks](hooks.md),",
        "[history and report](report.md).",
        "",
    ]
    lines += [f"- [`{ctx.command_path}`](#{_anchor(ctx.command_path)})" for _c, ctx in found]
    lines.append("")
    for command, ctx in found:
        lines += command_section(command, ctx)
    return "\n".join(lines).rstrip("\n") + "\n"


def _between(page: Path, current: str, begin: str, end: str, body: str) -> str:
    """``current`` with what lies between the markers replaced by ``body``."""
    try:
        head, rest = current.split(begin + "\n", 1)
        _old, tail = rest.split(end, 1)
    except ValueError:
        raise SystemExit(f"{page}: the markers {begin!r} and {end!r} are missing") from None
    return head + begin + "\n" + body + end + tail


def sbatch_page(current: str) -> str:
    """docs/sbatch.md with its generated option table replaced by today's."""
    return _between(SBATCH_PAGE, current, BEGIN, END, optiontable.markdown_reference())


def key_markers(section: str, source: str) -> tuple[str, str]:
    begin = (
        f"<!-- BEGIN [{section}] keys: written by `python -m slurm_preempt.cli.reference` from {source} -->"
    )
    return begin, f"<!-- END [{section}] keys -->"


def pages(root: Path) -> dict[Path, str]:
    """Each generated page and the text it should have today."""
    found = {
        root / CLI_PAGE: cli_page(),
        root / SBATCH_PAGE: sbatch_page((root / SBATCH_PAGE).read_text()),
    }
    for section, page, declared, source in KEY_TABLES:
        path = root / page
        if not path.exists():
            continue  # a tree without that page (a test's): nothing to write into
        current = found.get(path) or path.read_text()
        # A blank line before the end marker: the table stays one markdown block of its own.
        table = keytable.markdown(declared) + "\n"
        found[path] = _between(page, current, *key_markers(section, source), table)
    return found


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_preempt.cli.reference", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir():
        parser.error(f"{args.root.resolve()} has no docs/ folder: run it from the repository's root")
    stale = []
    for path, text in pages(args.root).items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
    for path in stale:
        print(f"{'differs' if args.check else 'wrote'}: {path}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(run())
