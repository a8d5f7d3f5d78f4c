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


def test_every_key_the_docs_and_messages_name_is_declared():
    """``[watch] api_token_file`` in a page, a message or a comment names a key that exists."""
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("src/slurm_preempt/**/*.py")]
    named = set()
    for path in files:
        for section, name in re.findall(
            r"\[(watch|resume|report)\] `?([a-z]+_[a-z_]+|keep|signals)\b", path.read_text()
        ):
            named.add((section, name, path.name))
    assert named, "no key named anywhere: the pattern is wrong"
    unknown = sorted(n for n in named if n[1] not in _declared(n[0]))
    assert unknown == []
