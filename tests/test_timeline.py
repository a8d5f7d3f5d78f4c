"""The timeline picture: valid, self-contained SVG that shows every attempt, mark and wait."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from slurm_preempt.errors import UsageError
from slurm_preempt.records import history, timeline
from test_history import three_attempts


def test_svg_is_valid_and_self_contained():
    svg = timeline.render_svg(history.build("5", three_attempts()))
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag.endswith("svg")
    assert "href" not in svg and "http://" not in svg.replace("http://www.w3.org/2000/svg", "")
    assert svg.count('class="attempt"') == 3
    for text in (
        "pre1",
        "pre2",
        "pre3",
        "#0 node failure (preempted)",
        "#2 completed",
        "waited 30s",
        "notice",
        "deadline",
        "work lost",
        "url(#hatch)",
    ):
        assert text in svg, text


def test_write_html_and_refuse_other_suffixes(tmp_path):
    found = history.build("5", three_attempts())
    page = timeline.write(found, tmp_path / "t.html")
    assert page.read_text().startswith("<!doctype html>") and "<svg" in page.read_text()
    with pytest.raises(UsageError):
        timeline.write(found, tmp_path / "t.png")
    with pytest.raises(UsageError):
        timeline.render_svg(history.build("6", []))


@pytest.mark.skipif(not shutil.which("rsvg-convert"), reason="librsvg2-bin not installed")
def test_renders_to_png(tmp_path):
    svg = timeline.write(history.build("5", three_attempts()), tmp_path / "t.svg")
    subprocess.run(["rsvg-convert", "-o", str(tmp_path / "t.png"), str(svg)], check=True)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
