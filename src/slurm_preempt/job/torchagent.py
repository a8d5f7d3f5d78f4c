"""torchrun's agent, quiet at a notice: ``python -m slurm_preempt.job.torchagent TORCHRUN [ARGS...]``.

At a notice every worker gets SIGTERM from slurmstepd, and so does torchrun's agent: it raises
``SignalException``, sends SIGTERM to its workers, waits for them (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``,
the template sets it to the grace), then exits 1 with the exception's traceback, on every node: a job
log in which a notice handled well reads like a crash. This runs the same agent in this process
(``torch.distributed.run.main``, what the ``torchrun`` script runs) and, when it ends on a signal after
its workers stopped, says so in one line and exits 0: the workers' own lines (``Run``: "rank R:
preemption notice ... final checkpoint at step S") tell what each rank did. Any other ending (a
worker that failed, an error of the agent) is torchrun's own, traceback and exit code included.

USR1 and USR2 are ignored here, as the template's ``trap "" USR1 USR2`` did: the workers inherit
that, and a program that handles them (``Run`` does) acts on them. Where torch cannot be imported,
``TORCHRUN`` itself is run instead. Import-light: torch is imported only here, when run.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
from typing import NoReturn

# torch's own lines at a death signal: the one line of this module says it instead.
_DEATH = "Received %s death signal"
_CLOSING = "Sending process %s closing signal"


class _QuietAtNotice(logging.Filter):
    """Drops the agent's "death signal" warning and, after it, its "closing signal" lines; the same
    lines at any other shutdown (a worker that failed) stay."""

    def __init__(self) -> None:
        super().__init__()
        self.signalled = False

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if text.startswith(_DEATH):
            self.signalled = True
            return False
        return not (self.signalled and text.startswith(_CLOSING))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m slurm_preempt.job.torchagent TORCHRUN [ARGS...]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.run import main as torchrun
    except ImportError:
        os.execvp(argv[0], argv)  # no torch in this interpreter: the torchrun that was named
    sys.argv = [argv[0], *argv[1:]]
    quiet = _QuietAtNotice()
    for name in (
        "torch.distributed.elastic.agent.server.api",
        "torch.distributed.elastic.multiprocessing.api",
    ):
        logging.getLogger(name).addFilter(quiet)
    try:
        torchrun(argv[1:])
    except SignalException as exc:  # raised once the agent stopped its workers
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        name = signal.Signals(exc.sigval).name
        print(f"slurm-preempt: torchrun agent on {node}: {name}: its workers stopped; exiting 0", flush=True)
        return 0
    return 0


def _leave(code: int) -> NoReturn:
    """Exit ``code`` without the interpreter's finalization, its atexit handlers run first. With torch
    loaded that finalization took 1.1-1.5 s here (``import torch.distributed.run``, then a plain exit
    against ``os._exit``), after the workers' own exit and before srun could return: by now the workers
    have ended and the rendezvous is closed, and nothing of this process is left to finalize."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _leave(main(sys.argv[1:]))
