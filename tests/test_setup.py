"""scripts/setup.sh: a failed install stops the setup with pip's own error and a one-line hint."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_failed_install_stops_with_pips_error_and_a_hint(tmp_path):
    """Offline (no index, no local wheels), pip cannot get the build backend: setup must say so."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "src", clone / "src")
    for name in ("pyproject.toml", "README.md", "scripts/setup.sh"):
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, clone / name)
    (clone / "scripts/install-slurm.sh").write_text("exit 0\n")  # Slurm is not what this test is about
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    done = subprocess.run(
        ["bash", str(clone / "scripts/setup.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ERROR: Could not find a version that satisfies the requirement hatchling" in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "setup: pip could not install slurm-preempt and its dev tools into .venv"
    )
    assert "No such file or directory" not in done.stdout + done.stderr
