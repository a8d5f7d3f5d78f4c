"""Real Slurm accounting for the local test cluster: MariaDB and slurmdbd under the cluster's folder.

``testcluster up --accounting`` starts, before slurmctld, a private ``mariadbd`` (its own data folder,
socket and port, root inside the sandbox) and ``slurmdbd`` talking to it, registers the cluster with
``sacctmgr`` (``Slurm.add_cluster``), and points slurm.conf at slurmdbd, so ``sacct -D`` answers for
real. Debian packages: ``mariadb-server`` and ``slurmdbd`` (scripts/install-slurm.sh installs them with
WITH_ACCOUNTING=1). The plain cluster does not pay for any of this. With another Slurm release
(``versions``), slurmdbd and sacctmgr are that release's (slurmdbd must be at least as new as
slurmctld); MariaDB is the host's.
"""

from __future__ import annotations

import logging
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_preempt.durable import write_atomic
from slurm_preempt.errors import ClusterError, MissingDependencyError
from slurm_preempt.rehearsal import procs, versions
from slurm_preempt.rehearsal.procs import Started
from slurm_preempt.slurm.commands import Slurm

if TYPE_CHECKING:  # clusterspec renders slurm.conf with conf_lines() below
    from slurm_preempt.rehearsal.clusterspec import ClusterSpec

log = logging.getLogger(__name__)

REQUIRED = {"mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server", "slurmdbd": "slurmdbd"}
HOST_ONLY = ("mariadbd", "mariadb-install-db")  # what another release still takes from the host
DB_USER, DB_PASS, DB_NAME = "slurm", "sp-test-only", "slurm_acct_db"  # a private, loopback-only database


def ports(spec: ClusterSpec) -> tuple[int, int]:
    """(MariaDB, slurmdbd): above the 64 node ports that follow slurmctld's."""
    return spec.port + 66, spec.port + 67


def conf_lines(spec: ClusterSpec) -> list[str]:
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={ports(spec)[1]}",
        # The connection to slurmdbd ignores AuthInfo: its munge socket is given here.
        f"AccountingStoragePass={spec.munge_socket}",
    ]


def _which(binary: str) -> str:
    found = procs.which(binary)
    if not found:
        raise MissingDependencyError(
            f"accounting needs {binary}: apt-get install {' '.join(sorted(set(REQUIRED.values())))}"
        )
    return found


def check_packages(slurm: str = versions.SYSTEM) -> None:
    for binary in REQUIRED if slurm == versions.SYSTEM else HOST_ONLY:
        _which(binary)


def start(spec: ClusterSpec, env: dict[str, str]) -> list[Started]:
    """Start MariaDB and slurmdbd for ``spec``; return them (the caller stops them with the rest)."""
    check_packages(spec.slurm)
    d = spec.directory
    db_port, dbd_port = ports(spec)
    # One database per release: slurmdbd upgrades a schema at most two releases old and refuses one from
    # a release it cannot convert ("Database schema is too old"), and a downgrade not at all, so a
    # folder brought up again with another --slurm gets a database of its own.
    data, run = d / f"mysql-{spec.slurm}", d / "run"
    started = []
    if not (data / "mysql").is_dir():
        log.info("creating the MariaDB data folder")
        _run(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                "--user=root",
                f"--datadir={data}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            d / "log" / "mariadb-install.log",
        )
    sock = run / "mysqld.sock"
    sock.unlink(missing_ok=True)
    log.info("starting mariadbd")
    started.append(
        procs.start(
            "mariadbd",
            [
                _which("mariadbd"),
                "--no-defaults",
                "--user=root",
                f"--datadir={data}",
                f"--socket={sock}",
                f"--port={db_port}",
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                f"--pid-file={run}/mysqld.pid",
                f"--log-error={d}/log/mariadb.log",
                "--innodb-buffer-pool-size=32M",
            ],
            env,
            d / "log" / "mariadb.out",
        )
    )
    if not procs.wait_until(sock.exists, 30, 0.1):
        raise ClusterError(f"mariadbd did not start; see {d}/log/mariadb.log")
    grant = (
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}'; "
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
    )
    _run(
        ["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", grant], d / "log" / "mariadb.out"
    )
    _write_dbd_conf(spec, db_port, dbd_port)
    log.info("starting slurmdbd")
    slurmdbd = versions.runtime(spec.slurm).daemon_argv("slurmdbd", ["-D"], [d])
    started.append(procs.start("slurmdbd", slurmdbd, env, d / "log" / "slurmdbd.out"))
    if not procs.wait_until(lambda: _listening(dbd_port), 30, 0.2):
        raise ClusterError(f"slurmdbd did not listen on port {dbd_port}; see {d}/log/slurmdbd.log")
    clients = {**env, **versions.client_env(spec.slurm, d, env.get("PATH", procs.SYSTEM_PATH))}
    if Slurm(env=clients).add_cluster(spec.name):
        log.info("registered cluster %s with slurmdbd", spec.name)
    return started


def _write_dbd_conf(spec: ClusterSpec, db_port: int, dbd_port: int) -> None:
    d = spec.directory
    text = (
        "\n".join(
            [
                "AuthType=auth/munge",
                f"AuthInfo=socket={spec.munge_socket}",
                "DbdHost=localhost",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                f"PidFile={d}/run/slurmdbd.pid",
                f"LogFile={d}/log/slurmdbd.log",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                f"StorageUser={DB_USER}",
                f"StoragePass={DB_PASS}",
                f"StorageLoc={DB_NAME}",
            ]
        )
        + "\n"
    )
    # slurmdbd reads slurmdbd.conf next to slurm.conf and refuses it unless only SlurmUser can read it.
    write_atomic(spec.conf_path.parent / "slurmdbd.conf", text, 0o600)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _run(argv: list[str], log: Path) -> None:
    """MariaDB's own tools (not Slurm's: those go through slurm.commands), their output to ``log``."""
    with open(log, "ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=60)
    if done.returncode != 0:
        raise ClusterError(f"`{' '.join(argv[:3])} ...` failed (exit {done.returncode}); see {log}")
