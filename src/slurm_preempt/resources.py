"""Where the shipped data folders are: ``templates/`` (sbatch templates) and ``etc/`` (admin files, laid
out as they are installed: ``etc/slurm/`` under the hooks prefix, ``etc/slurm-preempt/`` the config
example, ``etc/systemd/system/`` the watcher's unit).

In a wheel they sit inside the package under ``_data/``; in a source checkout (or an editable
install) they are the top-level folders of the repository.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent.parent  # src/slurm_preempt -> repository root


def data_dir(name: str) -> Path:
    """Path of a shipped folder: ``templates`` or ``etc`` (or a folder below them, ``etc/slurm``)."""
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _CHECKOUT / name
