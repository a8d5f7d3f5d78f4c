"""The one place that runs Slurm commands.

Every call is an argv list (never a shell), has a timeout, and raises a typed error carrying argv,
exit code and stderr. Which cluster is talked to is decided the Slurm way, by ``SLURM_CONF`` in the
environment (the local test cluster exports its own). Parsing lives in ``slurm.parse`` as pure
functions. ``Slurm`` keeps no state between calls, so threads may share one; it satisfies
``slurm.interface.WatcherSlurm``, the narrow set of calls the drain watcher makes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurm_preempt.errors import JobGoneError, SlurmError, SlurmNotFoundError, SlurmTimeoutError

if TYPE_CHECKING:
    from slurm_preempt.slurm.parse import AcctRecord, Job, Node

DEFAULT_TIMEOUT = 30.0


def _parse():
    """The parsers, imported on first use: the watcher's signal helper (``watch.sender``), which only
    runs scancel and must start fast, never loads them."""
    from slurm_preempt.slurm import parse

    return parse


# Slurm's words for "that job is gone", across 22.05 and 24.11.
_GONE_MARKERS = (
    "Invalid job id specified",
    "Job has already finished",
    "Job/step already completing",
)


@dataclass
class Slurm:
    """Runs Slurm commands. One instance per caller; cheap to create."""

    timeout: float = DEFAULT_TIMEOUT
    env: Mapping[str, str] | None = None  # None: this process's environment

    # ------------------------------------------------------------------------------------ runner

    def run(self, argv: Sequence[str], *, timeout: float | None = None, input_text: str | None = None) -> str:
        """Run ``argv``; return stdout. Raise SlurmNotFoundError, SlurmTimeoutError or SlurmError."""
        argv = [str(a) for a in argv]
        if shutil.which(argv[0], path=(self.env or os.environ).get("PATH")) is None:
            raise SlurmNotFoundError(argv)
        limit = self.timeout if timeout is None else timeout
        try:
            proc = subprocess.run(
                argv,
                input=input_text,
                capture_output=True,
                text=True,
                timeout=limit,
                env=dict(self.env) if self.env is not None else None,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmTimeoutError(argv, limit) from None
        except OSError as exc:  # not executable, vanished between which() and exec
            raise SlurmError(argv, None, str(exc)) from None
        if proc.returncode != 0:
            if any(marker in proc.stderr for marker in _GONE_MARKERS):
                raise JobGoneError(argv, proc.returncode, proc.stderr)
            raise SlurmError(argv, proc.returncode, proc.stderr)
        return proc.stdout

    # ------------------------------------------------------------------------------------ queries

    def version(self) -> tuple[int, int]:
        return _parse().parse_version(self.run(["sinfo", "--version"]))

    def nodes(self, names: Iterable[str] | None = None, states: str | None = None) -> list[Node]:
        """All nodes (or ``names``), in one ``sinfo`` call whatever the cluster size."""
        argv = ["sinfo", "-h", "-N", "-O", _parse().format_arg(_parse().NODE_FIELDS)]
        if names:
            argv += ["-n", _parse().compress_nodes(names)]
        if states:
            argv += ["-t", states]
        return _parse().parse_nodes(self.run(argv))

    def jobs(
        self,
        job_ids: Iterable[str] | None = None,
        nodes: Iterable[str] | None = None,
        states: str | None = None,
        user: str | None = None,
    ) -> list[Job]:
        """Jobs filtered by ids, nodes, states and user, in one ``squeue`` call."""
        argv = ["squeue", "-h", "-O", _parse().format_arg(_parse().JOB_FIELDS)]
        ids = list(job_ids or [])
        if ids:
            argv += ["-j", ",".join(ids)]
        if nodes:
            argv += ["-w", _parse().compress_nodes(nodes)]
        if states:
            argv += ["-t", states]
        if user:
            argv += ["-u", user]
        try:
            return _parse().parse_jobs(self.run(argv))
        except JobGoneError:
            # squeue -j with only ended ids exits 1 on 22.05; "no such job" is an empty answer.
            return []

    def job(self, job_id: str) -> Job | None:
        found = self.jobs(job_ids=[job_id], states="all")
        return next((j for j in found if j.job_id == str(job_id)), found[0] if found else None)

    def accounting(self, job_ids: Iterable[str] | None = None, **filters: str) -> list[AcctRecord]:
        """Every attempt of the jobs (``sacct -D``): requeued attempts included."""
        argv = ["sacct", "-n", "-P", "-X", "-D", "--format=" + ",".join(_parse().ACCT_FIELDS)]
        ids = list(job_ids or [])
        if ids:
            argv += ["-j", ",".join(ids)]
        for flag, value in filters.items():  # starttime=..., user=..., partition=...
            argv.append(f"--{flag}={value}")
        return _parse().parse_acct(self.run(argv))

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
        return _parse().parse_submitted(self.run(["sbatch", "--parsable", *extra_args, script_path]))

    def signal(self, job_id: str, signal: str, *, batch_only: bool = False, full: bool = False) -> None:
        """``scancel --signal``: the only way slurm-preempt signals a job (never a PID from a file)."""
        argv = ["scancel", f"--signal={signal}"]
        if batch_only:
            argv.append("--batch")
        if full:
            argv.append("--full")
        self.run([*argv, str(job_id)])

    def signal_many(self, job_ids: Sequence[str], signal: str, *, batch_only: bool = False) -> str:
        """One ``scancel --signal`` for many jobs (a correlated preemption: one process, not one per job).
        scancel signals every job it can and names each one it could not on stderr, which is returned
        ("" when all were signalled). A timeout or a missing scancel still raises."""
        argv = ["scancel", f"--signal={signal}", *(["--batch"] if batch_only else []), *map(str, job_ids)]
        try:
            self.run(argv)
        except (SlurmTimeoutError, SlurmNotFoundError):
            raise
        except SlurmError as exc:
            return exc.stderr or str(exc)
        return ""

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", str(job_id)])

    def requeue(self, job_id: str) -> None:
        """Requeue one job, or one array task named ``A_T``.

        Name array tasks ``A_T`` (``Job.display_id``): on 22.05 one task of an array carries the
        array's own id as its job id, and requeueing that id requeues every task of the array.
        """
        self.run(["scontrol", "requeue", str(job_id)])

    def update_job(self, job_id: str, **fields: str) -> None:
        """``scontrol update jobid=J key=value ...`` (e.g. starttime=now, features=standard)."""
        pairs = [f"{key}={value}" for key, value in fields.items()]
        self.run(["scontrol", "update", f"jobid={job_id}", *pairs])

    def update_nodes(self, names: Iterable[str], state: str, reason: str | None = None) -> None:
        """Set nodes DRAIN, DOWN or RESUME; a reason is required by Slurm for drain and down."""
        argv = [
            "scontrol",
            "update",
            f"nodename={_parse().compress_nodes(names)}",
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

    def ping(self) -> bool:
        """True when the controller answers."""
        try:
            return "UP" in self.run(["scontrol", "ping"], timeout=10)
        except SlurmError:
            return False
