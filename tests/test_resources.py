"""resources: the shipped files found in a checkout and in an installed wheel, by one set of names."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from slurm_preempt import resources

REPO = Path(__file__).resolve().parent.parent
WHEEL_DATA = "slurm_preempt/_data/"


def test_the_wheel_places_each_folder_where_resources_looks_for_it():
    table = tomllib.loads((REPO / "pyproject.toml").read_text())
    force_include = table["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert force_include == {
        folder: WHEEL_DATA + place for folder, place in resources.CHECKOUT_FOLDERS.items()
    }


def test_every_shipped_file_of_the_checkout_is_found_by_its_wheel_name():
    shipped = 0
    for folder, place in resources.CHECKOUT_FOLDERS.items():
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                name = f"{place}/{path.relative_to(REPO / folder)}"
                assert resources.checkout_path(name, REPO) == path
                assert resources.data_path(name) == path  # this is a checkout (editable install)
                shipped += 1
    assert shipped >= 12
    hook = resources.data_path("etc/slurm/prolog.d/50-slurm-preempt")
    assert hook == REPO / "prolog.d" / "50-slurm-preempt" and hook.is_file()
    assert resources.data_dir("templates") == REPO / "templates"


def test_an_installed_copy_reads_its_own_data_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "_INSTALLED", tmp_path)
    (tmp_path / "etc/slurm/prolog.d").mkdir(parents=True)
    assert (
        resources.data_path("etc/slurm/prolog.d/50-slurm-preempt")
        == tmp_path / "etc/slurm/prolog.d/50-slurm-preempt"
    )
    assert resources.data_dir("templates") == tmp_path / "templates"


def test_a_name_nothing_ships_under_is_refused():
    with pytest.raises(ValueError, match="ships nothing named"):
        resources.checkout_path("src/slurm_preempt/cli")
