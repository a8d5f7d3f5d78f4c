"""The command's one error mapping and its one logging configuration (cli/__init__.py, cli/_logging.py)."""

from __future__ import annotations

from click.testing import CliRunner

from slurm_preempt.cli import main
from slurm_preempt.job import interval


def _broken(*_args):
    raise KeyError("boom")


def test_a_bug_is_one_line_and_its_traceback_shows_with_v(monkeypatch):
    monkeypatch.setattr(interval, "young_daly", _broken)
    quiet = CliRunner().invoke(main, ["resume", "interval", "-c", "9", "-m", "99"])
    assert quiet.exit_code == 1 and "Traceback" not in quiet.output
    assert quiet.output.strip().splitlines() == [
        "Error: unexpected KeyError: 'boom' (a bug in slurm-preempt: run the command again with -v "
        "for the traceback, and report it)"
    ]
    verbose = CliRunner().invoke(main, ["-v", "resume", "interval", "-c", "9", "-m", "99"])
    assert verbose.exit_code == 1 and "Traceback" in verbose.output and "KeyError: 'boom'" in verbose.output


def test_library_lines_are_short_and_quiet_keeps_only_warnings(tmp_path):
    def down(*options):
        return CliRunner().invoke(main, [*options, "testcluster", "down", "--dir", str(tmp_path)])

    assert down().output == f"testcluster: no test cluster in {tmp_path}\n"
    assert down("-q").output == ""
    assert down().output.count("no test cluster") == 1  # configured again, never twice
