"""The shipped systemd units: their paths are README's install, systemd accepts them, and they say what
the watcher's crash semantics need (notify, watchdog, restart on failure, no restart for bad config)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNITS = {
    "system": ROOT / "etc/systemd/system/slurm-preempt-watch.service",
    "user": ROOT / "etc/systemd/user/slurm-preempt-watch.service",
}


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in systemd
    parser.read_string(path.read_text())
    return parser


def _readme_prefix() -> str:
    """Where README's "Using it on a real cluster" installs: `python3 -m venv PREFIX`."""
    found = re.search(r"python3 -m venv (\S+) &&", (ROOT / "README.md").read_text())
    assert found, "README no longer shows the install command"
    return found.group(1)


@pytest.mark.parametrize("kind", sorted(UNITS))
def test_the_unit_runs_the_installed_command(kind):
    service = _unit(UNITS[kind])["Service"]
    binary, *args = service["ExecStart"].split()
    assert binary == f"{_readme_prefix()}/bin/slurm-preempt"
    assert args == ["watch", "--cluster" if kind == "system" else "--user"]
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"].split() == ["2", "3"]  # usage and config errors
    assert int(service["WatchdogSec"]) > 2 * 15  # well above the default Slurm timeout
    assert service["KillMode"] == "mixed"  # signal helpers may finish what they started


@pytest.mark.parametrize("kind", sorted(UNITS))
def test_systemd_accepts_the_unit(kind, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    # The same unit, pointing at this checkout's command (verify checks the binary exists).
    here = str(Path(sys.executable).with_name("slurm-preempt"))
    text = UNITS[kind].read_text().replace(f"{_readme_prefix()}/bin/slurm-preempt", here)
    unit = tmp_path / "slurm-preempt-watch.service"
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
