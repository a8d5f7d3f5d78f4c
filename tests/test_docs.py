"""The docs against the real commands: the generated reference is current, and every ``slurm-preempt``
command line shown in README.md and docs/*.md parses with the click command itself (so no page names an
option, a subcommand or a value type that does not exist)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from slurm_preempt.cli import main, reference

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*```\s*([\w-]*)")
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "text"}
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
SEPARATORS = {";", "&", "&&", "|", "||", "(", ")", ";;"}
RUNS = re.compile(r"(^|[\s;&|(\"])(\S*/)?slurm-preempt(\s|$)")  # a line that may run it
PREFIXES = {"sudo", "eval", "exec", "time", "then", "do", "if", "while", "!", "{"}


# ------------------------------------------------------------------------------ the reference is current


def test_generated_reference_pages_are_current():
    """docs/cli.md and the option table of docs/sbatch.md are what the generator writes today; when this
    fails, run `python -m slurm_preempt.cli.reference` and commit the result."""
    for path, text in reference.pages(ROOT).items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: python -m slurm_preempt.cli.reference"
        )


def test_the_reference_lists_every_command_and_option():
    page = (ROOT / "docs" / "cli.md").read_text()
    for command, ctx in reference.commands():
        assert f"## `{ctx.command_path}`" in page
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and param.expose_value:
                assert f"`{param.get_help_record(ctx)[0]}`" in page.replace("\\|", "|"), param.opts


def test_reference_check_mode_reports_a_stale_page(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    sbatch_page = (ROOT / "docs" / "sbatch.md").read_text()
    (tmp_path / "docs" / "sbatch.md").write_text(sbatch_page.replace("| `--mtbp SECONDS`", "| `--mtbf S`"))
    assert reference.run(["--root", str(tmp_path), "--check"]) == 1
    assert "differs" in capsys.readouterr().err
    assert reference.run(["--root", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "sbatch.md").read_text() == sbatch_page
    assert reference.run(["--root", str(tmp_path), "--check"]) == 0


# ------------------------------------------------------------------------------ command lines in the docs


def code_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, line number of the first line, lines) of each fenced block."""
    lang, start, lines = None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and lang is None:
            lang, start, lines = match.group(1).lower(), number + 1, []
        elif line.strip().startswith("```") and lang is not None:
            yield lang, start, lines
            lang = None
        elif lang is not None:
            lines.append(line)


def shell_lines(lang: str, lines: list[str]) -> Iterator[tuple[int, str]]:
    """(offset, logical line) of the shell commands of a block: in a console block only the lines after
    a prompt (``$ `` or root's ``# ``), elsewhere every line that is not a comment; continued lines
    joined."""
    pending, first = "", 0
    for offset, raw in enumerate(lines):
        line = raw
        if not pending:
            line = raw.strip()
            if line.startswith("$ ") or (lang == "console" and line.startswith("# ")):
                line = line[2:]
            elif lang == "console" or line.startswith("#"):
                continue  # output, or a comment
            first = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield first, pending + line
        pending = ""


def invocations(line: str) -> Iterator[list[str]]:
    """The argv of every ``slurm-preempt`` run in a shell line, inside ``$(...)`` too."""
    for inner in SUBSTITUTION.findall(line):
        yield from invocations(inner)
    lexer = shlex.shlex(SUBSTITUTION.sub("SUBST", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    tokens = list(lexer)
    skip = False
    for index, token in enumerate(tokens):
        if skip:
            skip = False
        elif token in SEPARATORS:
            yield from _command(words)
            words = []
        elif set(token) <= set("<>&"):  # a redirection, then its target
            skip = True
        elif token.isdigit() and index + 1 < len(tokens) and tokens[index + 1].startswith(("<", ">")):
            continue  # the 2 of 2>/dev/null
        else:
            words.append(token)
    yield from _command(words)


def _command(words: list[str]) -> Iterator[list[str]]:
    while words and (words[0] in PREFIXES or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
        words = words[1:]
    if words and Path(words[0]).name == "slurm-preempt":
        yield words[1:]


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for lang, start, lines in code_blocks(page.read_text()):
            if lang not in SHELL_BLOCKS:
                continue
            for offset, line in shell_lines(lang, lines):
                if not RUNS.search(line):
                    continue
                for argv in invocations(line):
                    found.append((f"{page.relative_to(ROOT)}:{start + offset}", argv))
    return found


def parse(argv: list[str]) -> None:
    """Parse ``slurm-preempt ARGV`` with the real click commands, as running it would, without running
    it: click.UsageError on an option, a subcommand or a value that does not exist."""
    command: click.Command = main
    ctx = main.make_context("slurm-preempt", list(argv))
    while isinstance(command, click.Group):
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
        rest = [*protected, *ctx.args]
        if not rest:
            return
        name, found, rest = command.resolve_command(ctx, rest)
        assert name is not None and found is not None
        command = found
        ctx = command.make_context(name, rest, parent=ctx)


def named_options(argv: list[str]) -> list[str]:
    """What is wrong with the subcommands and options a synopsis (``watch --cluster [--once] [--grace S]``)
    or a sentence names; values are placeholders there, so only names are checked."""
    command: click.Command = main
    ctx = click.Context(main, info_name="slurm-preempt", **main.context_settings)
    words = [w.strip("[]") for w in argv]
    problems, index = [], 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            break
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            option = next((p for p in command.params if name in [*p.opts, *p.secondary_opts]), None)
            if option is None and name not in ctx.help_option_names:
                problems.append(f"{name} is not an option of {ctx.command_path}")
            elif (
                isinstance(option, click.Option) and not (option.is_flag or option.count) and "=" not in word
            ):
                index += 1  # its value
        elif isinstance(command, click.Group):
            if word.isupper() or word.strip(".") == "":
                break  # COMMAND, ...: a placeholder
            found = command.get_command(ctx, word)
            if found is None:
                problems.append(f"{word!r} is not a command of {ctx.command_path}")
                break
            command = found
            ctx = click.Context(found, info_name=word, parent=ctx, **found.context_settings)
        elif not ctx.allow_interspersed_args:
            break  # the rest is the command sbatch runs
    return problems


def is_synopsis(argv: list[str]) -> bool:
    return any(w.startswith("[") or w.endswith("]") or w.endswith("...") for w in argv)


def reader_value(param: click.Parameter | None, argv: list[str]) -> bool:
    """A value the page cannot know: a path on the reader's disk, or a shell expansion ("$pid")."""
    if param is None:
        return False
    if isinstance(param.type, click.Path):
        return True
    given = [b for a, b in zip(argv, argv[1:], strict=False) if a in param.opts]
    given += [w.split("=", 1)[1] for w in argv if "=" in w and w.split("=", 1)[0] in param.opts]
    return bool(given) and all(v.startswith("$") or v == "SUBST" for v in given)


DOCUMENTED = documented_commands()


def test_the_docs_show_command_lines():
    """The extraction finds what the pages show (a broken extractor would check nothing)."""
    assert len(DOCUMENTED) > 40
    shown = {" ".join(argv[:1]) for _where, argv in DOCUMENTED}
    assert {"sbatch", "watch", "hooks", "history", "report", "drill", "testcluster", "resume"} <= shown


@pytest.mark.parametrize(("where", "argv"), DOCUMENTED, ids=[w for w, _a in DOCUMENTED])
def test_every_documented_command_line_parses(where, argv, monkeypatch, capsys):
    # Inside a job the scripts export it; the resume commands take it as their default.
    monkeypatch.setenv("SLURM_PREEMPT_CHECKPOINT_DIR", "/tmp/ckpt")
    if is_synopsis(argv):
        assert not named_options(argv), f"{where}: {named_options(argv)}"
        return
    try:
        parse(argv)
    except click.exceptions.Exit as done:  # --help, --version
        assert done.exit_code == 0
    except click.BadParameter as exc:
        if not reader_value(exc.param, argv):
            pytest.fail(f"{where}: slurm-preempt {shlex.join(argv)}: {exc.format_message()}", pytrace=False)
    except click.UsageError as exc:
        pytest.fail(f"{where}: slurm-preempt {shlex.join(argv)}: {exc.format_message()}", pytrace=False)


@pytest.mark.parametrize(
    "argv",
    [
        ["sbatch", "--checkpoint-secs", "60", "--", "true"],
        ["nosuch"],
        ["resume", "interval", "--save-seconds", "ninety", "--mtbi", "1"],
        ["hooks", "install", "--bogus"],
    ],
)
def test_a_wrong_command_line_is_caught(argv):
    with pytest.raises(click.UsageError):
        parse(argv)


def test_a_wrong_name_in_a_synopsis_is_caught():
    assert named_options(["watch", "--cluster", "[--once]", "[--interval", "S]"]) == []
    assert named_options(["sbatch", "--nodes", "N", "--", "python", "--mtbp"]) == []
    assert named_options(["sbatch", "--mtbf", "S", "--", "x"]) == [
        "--mtbf is not an option of slurm-preempt sbatch"
    ]
    assert named_options(["resume", "nosuch"]) == ["'nosuch' is not a command of slurm-preempt resume"]


INLINE = re.compile(r"`((?:\S*/)?slurm-preempt [^`]+)`")


def inline_commands() -> list[tuple[str, list[str]]]:
    """``slurm-preempt ...`` in the prose of the pages (outside code blocks)."""
    found = []
    for page in PAGES:
        inside = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                inside = not inside
            elif not inside:
                for text in INLINE.findall(line):
                    for argv in invocations(text):
                        found.append((f"{page.relative_to(ROOT)}:{number}", argv))
    return found


INLINE_COMMANDS = inline_commands()


@pytest.mark.parametrize(("where", "argv"), INLINE_COMMANDS, ids=[w for w, _a in INLINE_COMMANDS])
def test_every_command_named_in_the_prose_exists(where, argv):
    assert not named_options(argv), f"{where}: slurm-preempt {' '.join(argv)}: {named_options(argv)}"


def test_invocations_are_found_in_shell_syntax():
    line = 'eval "$(slurm-preempt resume env -d ckpt)"; X=1 slurm-preempt watch --once >/dev/null 2>&1 &'
    assert list(invocations(line)) == [["resume", "env", "-d", "ckpt"], ["watch", "--once"]]
    assert list(invocations("slurm-preempt report --json | jq .  # a comment")) == [["report", "--json"]]
