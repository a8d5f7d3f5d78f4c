"""Shared fixtures. The ``cluster`` fixture starts one real local Slurm cluster for the whole session.

Set ``SP_TEST_CLUSTER_DIR`` / ``SP_TEST_PORT`` to run two test sessions side by side. Without Slurm
installed the cluster tests are skipped on a developer machine, and fail under CI=true.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from clusterutil import ClusterHandle, exported
from slurm_preempt.rehearsal import testcluster as tc

DATA = Path(__file__).parent / "data"
pytest_plugins = ("watchworld",)  # the in-memory world of the watcher's unit tests (its `world` fixture)


CLUSTER_FIXTURES = {"cluster", "clean_cluster"}


def pytest_collection_modifyitems(items):
    """A test that uses the real cluster is a cluster test, marked or not: `-m "not cluster"` must never
    start (or stop) the session cluster."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


def _slurm_missing() -> str | None:
    try:
        tc.check_packages()
    except Exception as exc:  # MissingDependencyError
        return str(exc)
    if os.geteuid() != 0:
        return "the local test cluster needs root"
    return None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> ClusterHandle:
    """A running local cluster: 2 standard + 4 preemptible nodes, SLURM_CONF exported to tests."""
    problem = _slurm_missing()
    if problem:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI needs a real Slurm: {problem}", pytrace=False)
        pytest.skip(problem)
    port = int(os.environ.get("SP_TEST_PORT", "17300"))
    directory = Path(os.environ.get("SP_TEST_CLUSTER_DIR", f"/tmp/sp-test-cluster-{port}"))
    if directory.exists() and tc.load_state(directory) is None:
        shutil.rmtree(directory)
    spec = tc.ClusterSpec(directory=directory, port=port, standard=2, preemptible=4, cpus=16)
    tc.down(directory)  # a cluster left by an interrupted session is restarted fresh
    state = tc.up(spec, timeout=120)
    handle = ClusterHandle(state=state, workdir=tmp_path_factory.mktemp("jobs"))
    try:
        with exported(state.env()):
            yield handle
    finally:
        tc.down(directory)


@pytest.fixture
def clean_cluster(cluster) -> ClusterHandle:
    """The session cluster, with no jobs and every node back in service after the test."""
    yield cluster
    cluster.reset()
