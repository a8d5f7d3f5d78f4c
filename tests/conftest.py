"""Shared fixtures, and the one skip policy of the suite.

The ``cluster`` fixture starts one real local Slurm cluster for the whole session. Set
``SP_TEST_CLUSTER_DIR`` / ``SP_TEST_PORT`` to run two test sessions side by side.

A test skips only when this machine lacks something it needs; on a developer's machine that is a
skip, under CI=true it is a failure (``pytest_runtest_makereport`` below): scripts/setup.sh and
scripts/test.sh install everything, so a skip in CI is a missing package, never a pass. The reasons
the suite can skip for: Slurm, munge or accounting (slurmdbd, MariaDB) not installed; not root (the
local cluster, hooks installed as root, files of another owner, a tmpfs mount); torch not installed
(pip); lightning not installed (pip, scripts/test.sh installs it); rsvg-convert missing (Debian's
librsvg2-bin).

``--slurm 24.11`` (or ``SP_TEST_SLURM=24.11``) runs the clusters on that Slurm release instead of the
host's (``slurm_preempt.rehearsal.versions``); scripts/test.sh runs the cluster tests on each release.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterutil import ClusterHandle, base_port, cluster_dir, release, running_cluster, slurm_problem
from slurm_preempt.rehearsal import pyslurmbuild, versions
from slurm_preempt.rehearsal import testcluster as tc

DATA = Path(__file__).parent / "data"
pytest_plugins = ("watchworld",)  # the in-memory world of the watcher's unit tests (its `world` fixture)


CLUSTER_FIXTURES = {"cluster", "clean_cluster"}


def pytest_addoption(parser):
    parser.addoption(
        "--slurm",
        default=os.environ.get("SP_TEST_SLURM", versions.SYSTEM),
        choices=list(versions.RELEASES),
        help="Slurm release the test clusters run (default: $SP_TEST_SLURM or the host's packages)",
    )


def pytest_configure(config):
    # One source for fixtures and helpers that start clusters of their own (clusterutil.release()).
    os.environ["SP_TEST_SLURM"] = config.getoption("--slurm")


def pytest_report_header(config):
    return f"slurm release: {config.getoption('--slurm')}"


def pytest_collection_modifyitems(config, items):
    """A test that uses the real cluster is a cluster test, marked or not: `-m "not cluster"` must never
    start (or stop) the session cluster. A ``pyslurm`` test is left out (deselected, not skipped) on a
    release pyslurm is not built for: it has nothing to run there."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
    if config.getoption("--slurm") not in pyslurmbuild.PYSLURM:
        left_out = [item for item in items if item.get_closest_marker("pyslurm")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("pyslurm")]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_to_failure(report) -> None:
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: a test may not skip here ({reason}): install what it needs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_to_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _skip_to_failure(outcome.get_result())


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> ClusterHandle:
    """A running local cluster: 2 standard + 4 preemptible nodes, SLURM_CONF (and for another release,
    PATH) exported to tests."""
    problem = slurm_problem()
    if problem:
        pytest.skip(problem)  # a failure under CI=true, like every skip
    port = base_port()
    spec = tc.ClusterSpec(
        directory=cluster_dir(port),
        port=port,
        standard=2,
        preemptible=4,
        cpus=16,
        slurm=release(),
    )
    with running_cluster(spec, tmp_path_factory.mktemp("jobs")) as handle:
        yield handle


@pytest.fixture
def clean_cluster(cluster) -> ClusterHandle:
    """The session cluster, with no jobs and every node back in service after the test."""
    yield cluster
    cluster.reset()


_WATCHED_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGCONT", "SIGHUP")


@pytest.fixture(autouse=True)
def _signal_handlers_left_as_found():
    """A test that leaves a signal handler behind would make a later test's "handlers restored" check
    see it (it did, in CI): each test must hand the process back with the handlers it found."""
    import signal

    found = {name: signal.getsignal(getattr(signal, name)) for name in _WATCHED_SIGNALS}
    yield
    left = {}
    for name, handler in found.items():
        now = signal.getsignal(getattr(signal, name))
        if now is not handler:
            left[name] = now
            signal.signal(getattr(signal, name), handler)
    assert not left, f"the test left signal handlers behind: {left}"


def pytest_sessionfinish(session, exitstatus):
    """multiprocessing joins every child it started when the interpreter exits: one left running by a
    failed test would hang the session after its summary (it did, in CI). None may outlive the run."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(10)
