"""slurm-preempt: Slurm jobs on preemptible nodes without losing work.

Importing this package does nothing and imports nothing heavy: the job-side names (``Run``,
``CheckpointStore``, ...) load on first use, and click and jinja2 are only imported by the CLI and the
sbatch generator.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (loaded on first attribute access)
_LAZY = {
    "Run": "job.resume",
    "CheckpointStore": "job.checkpoint",
    "Checkpoint": "job.checkpoint",
    "Notice": "notice",
    "read_notice": "notice",
    "Slurm": "slurm.commands",
}

__all__ = ["CheckpointStore", "Checkpoint", "Notice", "Run", "Slurm", "read_notice"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'slurm_preempt' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
