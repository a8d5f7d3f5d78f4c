"""The one place that runs Slurm commands.

Every call is an argv list (never a shell), has a timeout, and raises a typed error carrying argv,
exit code and stderr. Output is read as bytes (Slurm prints job names and comments raw, bytes of any
value) and decoded with replacement; every job id and node name is checked (``ids``) before it goes
into an argv, so a value read from a user's record can never become an option or name other jobs.
Times are asked for as epoch seconds (``SLURM_TIME_FORMAT``), whatever this host's time zone.
Which cluster is talked to is decided the Slurm way, by ``SLURM_CONF`` in the environment (the local
test cluster exports its own). Parsing lives in ``slurm.parse`` as pure
functions. ``Slurm`` keeps no state between calls, so threads may share one; it satisfies
``slurm.interface.WatcherSlurm``, the narrow set of calls the drain watcher makes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_preempt import ids
from slurm_preempt.errors import JobGoneError, SlurmError, SlurmNotFoundError, SlurmTimeoutError, UsageError
from slurm_preempt.slurm import parse, sacct
from slurm_preempt.slurm.parse import Job, Node
from slurm_preempt.slurm.priority import SQUEUE_FORMAT, Queued, parse_queue
from slurm_preempt.slurm.sacct import AcctRecord

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0

# Enough configuration for a client to start and print its version; it names no real controller.
_VERSION_PROBE_CONF = "ClusterName=version-probe\nSlurmctldHost=localhost\n"
_NO_VERSION = "cannot tell the Slurm version: `sinfo --version` failed, also with a minimal slurm.conf"


def _no_version(argv: list[str], returncode: int | None, stderr: str) -> SlurmError:
    """The error of a version that cannot be told, with the client's last word (its fatal line)."""
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    error = SlurmError(argv, returncode, "", f"{_NO_VERSION}: {last}" if last else _NO_VERSION)
    error.stderr = stderr
    return error


# Slurm's words for "that job is gone" (its error strings for ESLURM_INVALID_JOB_ID, ESLURM_JOB_FINISHED
# and ESLURM_ALREADY_DONE), across 22.05, 24.11 and 26.05: scontrol prints them alone ("Invalid job id
# specified for job 12"), scancel after the job ("Kill job error on job id 12: Invalid job id specified").
_GONE_MARKERS = (
    "Invalid job id specified",
    "Job has already finished",
    "Job/step already completing",
)


def job_gone(complaint: str) -> bool:
    """True when Slurm's complaint (stderr, or one line of it) says the job named has ended or never
    existed: nothing to act on any more, rather than an act that failed."""
    return any(marker in complaint for marker in _GONE_MARKERS)


@dataclass
class Slurm:
    """Runs Slurm commands. One instance per caller; cheap to create."""

    timeout: float = DEFAULT_TIMEOUT
    env: Mapping[str, str] | None = None  # None: this process's environment
    # The commands' working directory; None: ours (sbatch submits from it). The watcher and its signal
    # helper run theirs from "/": a relative entry of root's PATH must not name a folder a user writes.
    cwd: str | None = None

    # ------------------------------------------------------------------------------------ runner

    def run(self, argv: Sequence[str], *, timeout: float | None = None, input_text: str | None = None) -> str:
        """Run ``argv``; return stdout decoded (invalid UTF-8 replaced). Raise SlurmNotFoundError,
        SlurmTimeoutError or SlurmError."""
        return self.run_bytes(argv, timeout=timeout, input_text=input_text).decode("utf-8", "replace")

    def run_bytes(
        self, argv: Sequence[str], *, timeout: float | None = None, input_text: str | None = None
    ) -> bytes:
        """Run ``argv``; return stdout as Slurm printed it (the parsers frame records on bytes)."""
        argv = [str(a) for a in argv]
        base = os.environ if self.env is None else self.env
        if shutil.which(argv[0], path=base.get("PATH")) is None:
            raise SlurmNotFoundError(argv)
        limit = self.timeout if timeout is None else timeout
        try:
            proc = subprocess.run(
                argv,
                input=None if input_text is None else input_text.encode(),
                capture_output=True,
                timeout=limit,
                env={**base, **parse.TIME_FORMAT_ENV},
                cwd=self.cwd,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmTimeoutError(argv, limit) from None
        except OSError as exc:  # not executable, vanished between which() and exec
            raise SlurmError(argv, None, str(exc)) from None
        stderr = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            if job_gone(stderr):
                raise JobGoneError(argv, proc.returncode, stderr)
            raise SlurmError(argv, proc.returncode, stderr)
        return proc.stdout

    # ------------------------------------------------------------------------------------ queries

    def version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm client commands, e.g. (22, 5); needs no slurm.conf.

        Every client (22.05, 24.11 and 26.05 checked) reads its configuration before it looks at
        ``--version`` or ``-V``: without one (no SLURM_CONF, no /etc/slurm/slurm.conf, no configless
        DNS record) it dies with "Could not establish a configuration source", and with SLURM_CONF
        naming a missing file it retries for 60 s. The version it prints is its own, whatever the
        configuration says, so then ask again with a throwaway two-line one.
        """
        env = dict(os.environ if self.env is None else self.env)
        named = env.get("SLURM_CONF")
        if named is None or os.path.isfile(named):
            try:
                return parse.parse_version(self.run(["sinfo", "--version"]))
            except SlurmNotFoundError:
                raise
            except (SlurmError, ValueError):
                log.debug("sinfo --version failed with this configuration: asking without it")
        with tempfile.TemporaryDirectory(prefix="slurm-preempt-version-") as folder:
            conf = Path(folder) / "slurm.conf"
            conf.write_text(_VERSION_PROBE_CONF)
            probe = Slurm(timeout=self.timeout, env={**env, "SLURM_CONF": str(conf)})
            argv = ["sinfo", "--version"]
            try:
                return parse.parse_version(probe.run(argv))
            except SlurmNotFoundError:
                raise
            except SlurmError as exc:
                raise _no_version(argv, exc.returncode, exc.stderr) from None
            except ValueError as exc:
                raise _no_version(argv, 0, str(exc)) from None

    def nodes(
        self, names: Iterable[str] | None = None, states: str | None = None, partition: str | None = None
    ) -> list[Node]:
        """All nodes (or ``names``, or those of ``partition``), in one ``sinfo`` call whatever the
        cluster size."""
        fields = parse.format_arg(parse.NODE_FIELDS, parse.NODE_TEXT_FIELDS)
        argv = ["sinfo", "-h", "-N", "-O", fields]
        if names:
            argv += ["-n", _nodes(names)]
        if states:
            argv += ["-t", states]
        if partition:
            argv.append(f"--partition={partition}")  # one argument: a name never reads as an option
        return parse.parse_nodes(self.run_bytes(argv))

    def jobs(
        self,
        job_ids: Iterable[str] | None = None,
        nodes: Iterable[str] | None = None,
        states: str | None = None,
        user: str | None = None,
    ) -> list[Job]:
        """Jobs filtered by ids, nodes, states and user, in one ``squeue`` call."""
        argv = ["squeue", "-h", "-O", parse.format_arg(parse.JOB_FIELDS, parse.JOB_TEXT_FIELDS)]
        wanted = _job_names(job_ids or [])
        if wanted:
            argv += ["-j", ",".join(wanted)]
        if nodes:
            argv += ["-w", _nodes(nodes)]
        if states:
            argv += ["-t", states]
        if user:
            argv += ["-u", user]
        try:
            return parse.parse_jobs(self.run_bytes(argv))
        except JobGoneError:
            # squeue -j with only ended ids exits 1 on 22.05; "no such job" is an empty answer.
            return []

    def queue(self, partition: str) -> list[Queued]:
        """Pending and running jobs of ``partition`` with their priorities (``slurm.priority``)."""
        argv = ["squeue", "-h", "-t", "pending,running", f"--partition={partition}", "-o", SQUEUE_FORMAT]
        return parse_queue(self.run(argv))

    def job(self, job_id: str) -> Job | None:
        found = self.jobs(job_ids=[job_id], states="all")
        return next((j for j in found if j.job_id == str(job_id)), found[0] if found else None)

    def steps(self, job_id: str) -> list[str]:
        """The job's numbered steps still known to the controller (``J.0``, ...; not batch, extern or
        interactive), in one ``squeue -s`` call."""
        try:
            out = self.run(["squeue", "-h", "-s", "-j", _job_names([job_id])[0], "-o", "%i"])
        except JobGoneError:
            return []
        words = (line.strip() for line in out.splitlines())
        return [w for w in words if w.rpartition(".")[2].isdigit()]

    def accounting(self, job_ids: Iterable[str] | None = None, **filters: str) -> list[AcctRecord]:
        """Every attempt of the jobs (``sacct -D``): requeued attempts included."""
        argv = ["sacct", "-n", "-P", "-X", "-D", "--format=" + ",".join(sacct.ACCT_FIELDS)]
        wanted = _job_names(job_ids or [])
        if wanted:
            argv += ["-j", ",".join(wanted)]
        for flag, value in filters.items():  # starttime=..., user=..., partition=...
            argv.append(f"--{flag}={value}")
        return sacct.parse_acct(self.run_bytes(argv))

    # ------------------------------------------------------------------------------------ actions

    def submit(self, script_path: str, extra_args: Sequence[str] = (), test_only: bool = False) -> str:
        """``sbatch --parsable``; returns the job id. With ``test_only``, returns sbatch's answer."""
        if test_only:
            argv = ["sbatch", "--test-only", *extra_args, script_path]
            try:
                self.run(argv)
            except SlurmError as exc:
                # --test-only answers on stderr, and exits 0 only when the job could run.
                raise SlurmError(argv, exc.returncode, exc.stderr) from None
            return "ok"
        return parse.parse_submitted(self.run(["sbatch", "--parsable", *extra_args, script_path]))

    def signal(self, job_id: str, signal: str, *, batch_only: bool = False, full: bool = False) -> None:
        """``scancel --signal``: the only way slurm-preempt signals a job (never a PID from a file)."""
        argv = ["scancel", f"--signal={signal}"]
        if batch_only:
            argv.append("--batch")
        if full:
            argv.append("--full")
        self.run([*argv, *_job_names([job_id])])

    def signal_many(self, job_ids: Sequence[str], signal: str, *, batch_only: bool = False) -> str:
        """One ``scancel --signal`` for many jobs (a correlated preemption: one process, not one per job).
        scancel signals every job it can and names each one it could not on stderr, which is returned
        ("" when all were signalled). A timeout or a missing scancel still raises."""
        argv = ["scancel", f"--signal={signal}", *(["--batch"] if batch_only else []), *_job_names(job_ids)]
        try:
            self.run(argv)
        except (SlurmTimeoutError, SlurmNotFoundError):
            raise
        except SlurmError as exc:
            return exc.stderr or str(exc)
        return ""

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", *_job_names([job_id])])

    def cancel_many(self, job_ids: Sequence[str]) -> None:
        """One ``scancel`` for many jobs (a cluster's teardown). Without ``--signal`` scancel says
        nothing about a job that already ended, and exits 0."""
        if job_ids:
            self.run(["scancel", *_job_names(job_ids)])

    def requeue(self, job_id: str) -> None:
        """Requeue one job, or one array task named ``A_T``.

        Name array tasks ``A_T`` (``Job.display_id``): on 22.05 one task of an array carries the
        array's own id as its job id, and requeueing that id requeues every task of the array.
        """
        self.run(["scontrol", "requeue", *_job_names([job_id])])

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update jobid=J key=value ...`` (e.g. starttime=now, features=standard)."""
        pairs = [_pair(key, value) for key, value in fields.items()]
        self.run(["scontrol", "update", f"jobid={_job_names([job_id])[0]}", *pairs])

    def update_nodes(self, names: Iterable[str], state: str, reason: str | None = None) -> None:
        """Set nodes DRAIN, DOWN or RESUME; a reason is required by Slurm for drain and down."""
        argv = [
            "scontrol",
            "update",
            f"nodename={_nodes(names)}",
            f"state={state}",
        ]
        if reason is not None:
            argv.append(f"reason={reason}")
        self.run(argv)

    def drain(self, names: Iterable[str], reason: str) -> None:
        self.update_nodes(names, "DRAIN", reason)

    def set_down(self, names: Iterable[str], reason: str) -> None:
        self.update_nodes(names, "DOWN", reason)

    def resume(self, names: Iterable[str]) -> None:
        self.update_nodes(names, "RESUME")

    def release(self, job_id: str) -> None:
        """``scontrol release``: lift a hold (a launch-failure hold: the owner may; the MaxBatchRequeue
        hold: only an operator)."""
        self.run(["scontrol", "release", *_job_names([job_id])])

    def config(self) -> dict[str, str]:
        """The running controller's configuration (``scontrol show config``): key -> value text."""
        return parse.parse_config(self.run(["scontrol", "show", "config"]))

    def add_cluster(self, name: str, timeout: float = 60.0) -> bool:
        """Register cluster ``name`` with slurmdbd (``sacctmgr -i add cluster``); False when it already
        was. Asked first: sacctmgr refuses a cluster it knows with exit 1, saying so on stdout only."""
        if not _CLUSTER_NAME.fullmatch(name):
            raise UsageError(f"not a Slurm cluster name: {ids.shorten(name)}")
        argv = ["sacctmgr", "-n", "-P", "show", "cluster", "where", f"name={name}", "format=cluster"]
        known = self.run(argv, timeout=timeout)
        if name in known.split():
            return False
        self.run(["sacctmgr", "-i", "add", "cluster", name], timeout=timeout)
        return True

    def ping(self) -> bool:
        """True when the controller answers."""
        try:
            return "UP" in self.run(["scontrol", "ping"], timeout=10)
        except SlurmError:
            return False


# ---------------------------------------------------------------------------------------- argv checks


def _job_names(job_ids: Iterable[str]) -> list[str]:
    """Job ids (or ``A_T``) for an argv; UsageError for anything else (never an option, a list or a
    range of other jobs)."""
    names = [str(j) for j in job_ids]
    bad = [j for j in names if not ids.is_job_name(j)]
    if bad:
        raise UsageError(f"not a Slurm job id: {ids.shorten(bad[0])}")
    return names


def _nodes(names: Iterable[str]) -> str:
    try:
        return parse.compress_nodes(names)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


_CLUSTER_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")  # slurm.conf's ClusterName, as Slurm lowercases it
_VALUE = re.compile(r"[A-Za-z0-9_.:&|\[\]*()!,+-]{1,256}")


def _pair(key: str, value: str) -> str:
    """``key=value`` of ``scontrol update``: a keyword and a value without spaces or ``=``."""
    if not re.fullmatch(r"[A-Za-z]+", key) or not _VALUE.fullmatch(str(value)):
        raise UsageError(f"not a job field to update: {ids.shorten(key)}={ids.shorten(value)}")
    return f"{key}={value}"
