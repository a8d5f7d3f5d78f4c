"""The suite's skip policy (tests/conftest.py): a skip on a developer's machine, a failure in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMELINE_PNG = "tests/test_timeline.py::test_renders_to_png"  # skips when rsvg-convert is missing


def _run_without_rsvg(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CI": ci, "PATH": str(tmp_path)}  # no rsvg-convert on this PATH
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TIMELINE_PNG]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_missing_package_skips_on_a_developers_machine(tmp_path):
    done = _run_without_rsvg(tmp_path, ci="")
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout


def test_a_missing_package_fails_under_ci(tmp_path):
    done = _run_without_rsvg(tmp_path, ci="true")
    assert done.returncode == 1 and "skipped" not in done.stdout, done.stdout
    assert "CI=true: a test may not skip here (Skipped: librsvg2-bin not installed)" in done.stdout
