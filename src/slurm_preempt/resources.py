"""Where the shipped files are: sbatch templates, the hooks, and the admin files, named by their place in
the wheel's ``_data/`` folder, which mirrors where each goes on a cluster: ``etc/slurm/`` under the
hooks prefix (``prolog.d/``, ``epilog.d/``, ``slurm-preempt/``), ``etc/slurm-preempt/`` the config
example, ``etc/systemd/`` the watcher's units.

In a wheel they sit inside the package under ``_data/``. In a source checkout (or an editable install)
they are top-level folders of the repository, where ``prolog.d/`` and ``epilog.d/`` stand beside
``etc/`` rather than inside it: ``CHECKOUT_FOLDERS`` maps one layout to the other, as the wheel's
force-include table in pyproject.toml does (a test holds the two together).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent.parent  # src/slurm_preempt -> repository root
_INSTALLED = _PACKAGE / "_data"

# A top-level folder of the repository -> its place under the wheel's _data/.
CHECKOUT_FOLDERS = {
    "templates": "templates",
    "etc": "etc",
    "prolog.d": "etc/slurm/prolog.d",
    "epilog.d": "etc/slurm/epilog.d",
}


def data_path(name: str) -> Path:
    """A shipped file or folder by its place in the wheel (``templates``,
    ``etc/slurm/prolog.d/50-slurm-preempt``), wherever this copy of slurm-preempt keeps it.

    In a checkout, a folder whose content comes from several repository folders (``etc/slurm``) is only
    the part under ``etc/``: name the files below it."""
    if _INSTALLED.is_dir():
        return _INSTALLED / name
    return checkout_path(name)


def data_dir(name: str) -> Path:
    """A shipped folder: ``templates``, ``etc``, or one below them (``etc/slurm-preempt``)."""
    return data_path(name)


def checkout_path(name: str, root: Path = _CHECKOUT) -> Path:
    """Where the file the wheel keeps at ``_data/<name>`` is in a checkout of the repository at ``root``."""
    name = name.strip("/")
    placed = [
        (folder, place)
        for folder, place in CHECKOUT_FOLDERS.items()
        if name == place or name.startswith(place + "/")
    ]
    if not placed:
        raise ValueError(f"slurm-preempt ships nothing named {name}")
    folder, place = max(placed, key=lambda pair: len(pair[1]))  # the deepest: etc/slurm/prolog.d, not etc
    return root / folder / name[len(place) :].lstrip("/")
