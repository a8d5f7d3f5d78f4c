"""slurm-preempt: Slurm jobs on preemptible nodes without losing work.

The names here are the job author's (docs/resume.md): ``Run``, the checkpoint formats, the checkpoint
store, notices, the settings type and the errors a job may catch. Everything else is internal (the
Slurm runner, for one, is ``slurm_preempt.slurm.commands.Slurm``). Importing this package does nothing
and imports nothing heavy: the names load on first use, and click and jinja2 are only imported by the
CLI and the sbatch generator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> module that defines it (loaded on first attribute access)
_LAZY = {
    "Run": "job.resume",
    "PickleFormat": "job.formats",
    "TorchFormat": "job.formats",
    "ShardedFormat": "job.formats",
    "ResumeSettings": "job.settings",
    "CheckpointStore": "job.checkpoint",
    "Checkpoint": "job.checkpoint",
    "Notice": "notice",
    "read_notice": "notice",
    # What Run and CheckpointStore raise: CheckpointError (a save or restore failed, no folder),
    # MissingDependencyError (torch needed and missing); both are SlurmPreemptErrors.
    "SlurmPreemptError": "errors",
    "CheckpointError": "errors",
    "MissingDependencyError": "errors",
}

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "MissingDependencyError",
    "Notice",
    "PickleFormat",
    "ResumeSettings",
    "Run",
    "ShardedFormat",
    "SlurmPreemptError",
    "TorchFormat",
    "read_notice",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time each name loads on first use
    from slurm_preempt.errors import CheckpointError, MissingDependencyError, SlurmPreemptError
    from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore
    from slurm_preempt.job.formats import PickleFormat, ShardedFormat, TorchFormat
    from slurm_preempt.job.resume import Run
    from slurm_preempt.job.settings import ResumeSettings
    from slurm_preempt.notice import Notice, read_notice


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'slurm_preempt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
