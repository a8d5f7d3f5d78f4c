"""slurm/commands.py on the real Slurm: the client's version, asked with or without a slurm.conf."""

from __future__ import annotations

import os

import pytest

from slurm_preempt.errors import SlurmError
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.slurm.parse import parse_version


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without the cluster's SLURM_CONF, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key != "SLURM_CONF"}
    return {**env, **extra}


def test_version_with_and_without_a_slurm_conf(cluster):
    """22.05's clients read slurm.conf before --version: without one `sinfo --version` dies with
    "Could not establish a configuration source", and a missing SLURM_CONF file makes it retry 60 s."""
    config = cluster.slurm.run(["scontrol", "show", "config"])
    line = next(ln for ln in config.splitlines() if ln.startswith("SLURM_VERSION"))
    running = parse_version(line.partition("=")[2])  # what the cluster's controller runs
    assert Slurm().version() == running  # the cluster's SLURM_CONF
    assert Slurm(env=_env()).version() == running  # none (unless this machine has /etc/slurm/slurm.conf)
    assert Slurm(env=_env(SLURM_CONF=os.devnull)).version() == running  # one that is no configuration
    assert Slurm(timeout=20, env=_env(SLURM_CONF="/nonexistent/slurm.conf")).version() == running


def test_a_version_that_cannot_be_told_is_one_line(tmp_path):
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        "#!/bin/sh\necho 'sinfo: fatal: Could not establish a configuration source' >&2\nexit 1\n"
    )
    sinfo.chmod(0o755)
    with pytest.raises(SlurmError) as caught:
        Slurm(env={"PATH": str(tmp_path)}).version()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot tell the Slurm version: `sinfo --version` failed, also with a minimal")
    assert message.endswith("sinfo: fatal: Could not establish a configuration source")
