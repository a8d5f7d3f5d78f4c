"""Config sections declared once (``keytable``): what a declaration gives, and every key the docs, the
config example and the messages name is a declared one, and every declared key is in the docs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_preempt import keytable
from slurm_preempt.cli import reference
from slurm_preempt.job.settings import ResumeSettings
from slurm_preempt.keytable import Key, Problem, key, seconds, texts, whole
from slurm_preempt.records.prices import ReportSettings
from slurm_preempt.resources import data_dir
from slurm_preempt.watch.settings import Settings as WatchSettings

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = {"watch": WatchSettings, "resume": ResumeSettings, "report": ReportSettings}


@dataclass(frozen=True)
class Sample:
    wait: float = key(2.0, seconds(positive=True), "seconds to wait | or not")
    names: tuple[str, ...] = key(("a",), texts, "some names")
    count: int | None = key(None, whole(1), "how many", shown="all of them")
    label: str = key("", keytable.text, "a label")


def _declared(section: str) -> set[str]:
    return {k.name for k in keytable.keys(SECTIONS[section])}


# ---------------------------------------------------------------------------------------- a declaration


def test_a_declaration_gives_the_keys_defaults_and_docs_in_its_order():
    assert [k.name for k in keytable.keys(Sample)] == ["wait", "names", "count", "label"]
    assert keytable.keys(Sample)[0] == Key(
        "wait", 2.0, keytable.keys(Sample)[0].convert, "seconds to wait | or not", "2"
    )
    assert keytable.defaults(Sample) == {"wait": 2.0, "names": ["a"], "count": None, "label": ""}
    assert Sample() == Sample(2.0, ("a",), None, "")
    assert keytable.markdown(Sample).splitlines() == [
        "| key | default | meaning |",
        "|---|---|---|",
        "| `wait` | 2 | seconds to wait \\| or not |",
        '| `names` | `["a"]` | some names |',
        "| `count` | all of them | how many |",
        "| `label` | | a label |",
    ]


def test_reading_converts_what_it_can_and_says_what_it_cannot():
    values, problems = keytable.read(
        Sample, {"wait": 1, "names": "b", "count": 0, "colour": "red", "label": None}
    )
    assert values == {"wait": 1.0, "names": ("b",)}  # None: not given
    assert problems == [Problem("count", 0, "not a whole number >= 1"), Problem("colour", "red")]
    assert problems[0].says("x", "site.toml") == "[x] count = 0 in site.toml: not a whole number >= 1"
    assert problems[1].says("x") == "unknown key [x] colour"


@pytest.mark.parametrize(
    ("value", "why"),
    [(math.nan, "finite"), (math.inf, "finite"), (-1, "> 0"), (0, "> 0"), (True, "> 0"), ("5", "> 0")],
)
def test_seconds_are_finite_numbers_never_text_or_booleans(value, why):
    with pytest.raises(ValueError, match=why):
        seconds(positive=True)(value)
    assert seconds()(0) == 0.0 and isinstance(seconds()(3), float)


# ---------------------------------------------------------------------------------------- the docs


def _example_keys() -> dict[str, dict[str, str]]:
    """The ``# key = value`` lines of each section of the shipped config example."""
    found: dict[str, dict[str, str]] = {}
    section = ""
    for line in (data_dir("etc") / "slurm-preempt/config.toml.example").read_text().splitlines():
        header = re.match(r"^\[(\w+)\]", line)
        section = header.group(1) if header else section
        entry = re.match(r"^# ([a-z_]+) = (.+?)(\s{2,}#(.*))?$", line)
        if entry and section:
            found.setdefault(section, {})[entry.group(1)] = entry.group(4) or ""
    return found


def test_the_config_example_names_every_declared_key_and_no_other():
    example = _example_keys()
    for section in SECTIONS:
        assert set(example[section]) == _declared(section), section


def test_the_config_example_shows_the_defaults_unless_it_says_e_g():
    import tomllib

    for section, declared in SECTIONS.items():
        text = (data_dir("etc") / "slurm-preempt/config.toml.example").read_text()
        block = text.split(f"\n[{section}]\n", 1)[1].split("\n[", 1)[0]
        for found in keytable.keys(declared):
            line = next(x for x in block.splitlines() if x.startswith(f"# {found.name} = "))
            value = tomllib.loads(re.sub(r"\s{2,}#.*$", "", line[2:]))[found.name]
            if found.default is None or "e.g." in line:
                continue
            assert value == found.toml(), line


def test_the_docs_tables_are_the_declarations():
    """Written by ``python -m slurm_preempt.cli.reference`` (test_docs.py checks they are current)."""
    pages = reference.pages(ROOT)
    for section, page, declared, source in reference.KEY_TABLES:
        text = pages[ROOT / page]
        begin, end = reference.key_markers(section, source)
        table = text.split(begin, 1)[1].split(end, 1)[0]
        assert re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE) == [k.name for k in keytable.keys(declared)]
        assert (ROOT / page).read_text() == text


# Words that follow "[watch]" and the like in prose without being a key ("the [watch] keys").
PROSE = {"keys", "in", "source", "section", "table"}
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]


def test_every_key_the_docs_and_messages_name_is_declared():
    """``[watch] api_token_file`` in a page, a message or a comment names a key that exists."""
    files = [*PAGES, *ROOT.glob("src/slurm_preempt/**/*.py"), *ROOT.glob("examples/**/*")]
    named = set()
    for path in (f for f in files if f.is_file()):
        for section, name in re.findall(r"\[(watch|resume|report)\] `?([a-z][a-z_]*)\b", path.read_text()):
            if name not in PROSE:
                named.add((section, name, path.name))
    assert {n[1] for n in named} >= {"keep", "lease_ttl"}, "the pattern finds no key: it is wrong"
    unknown = sorted(n for n in named if n[1] not in _declared(n[0]))
    assert unknown == []


def _config_blocks(page: Path) -> list[tuple[str, str, int]]:
    """``(section, key, line)`` of every ``key = value`` (or ``# key = value``) line under a
    ``[watch]``, ``[resume]`` or ``[report]`` header inside a fenced block of ``page``."""
    found = []
    fenced, section = False, ""
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, section = not fenced, ""
            continue
        header = re.match(r"^\[([\w.]+)\]\s*$", line.strip())
        if fenced and header:
            section = header.group(1)
            continue
        entry = re.match(r"^#?\s*([a-z][a-z_]*)\s*=", line.strip())
        if fenced and entry and section in SECTIONS:
            found.append((section, entry.group(1), number))
    return found


def test_every_key_a_config_shown_in_the_docs_sets_is_declared():
    """A ``[report]`` block in docs/report.md sets keys a user copies: each must be one."""
    shown = [(page.name, *entry) for page in PAGES for entry in _config_blocks(page)]
    assert {entry[1] for entry in shown} >= {"report"}, "no config block found: the parser is wrong"
    unknown = [entry for entry in shown if entry[2] not in _declared(entry[1])]
    assert unknown == []


def test_a_config_block_with_a_key_that_is_none_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```toml\n[report]\ngpu_hour = 2\n# keep = 3\n[sbatch]\npartition = 'x'\n```\nkeep = 1\n")
    assert _config_blocks(page) == [("report", "gpu_hour", 3), ("report", "keep", 4)]
