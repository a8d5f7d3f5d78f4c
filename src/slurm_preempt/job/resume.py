"""The job-side API: restart info, checkpoints, preemption notices, requeue self.

::

    run = slurm_preempt.Run(checkpoint_dir="ckpt", every=50)
    state = run.restore() or fresh_state()        # None on a first run
    for step in range(run.step, total):
        train(state)
        if run.should_checkpoint(step + 1):       # interval reached, or a notice (agreed by all ranks)
            run.save(step + 1, state)
        if run.preempted:                         # final checkpoint durable
            run.requeue_and_exit()

Preemption arrives as a signal (USR1 from the watcher, SIGTERM from the cluster, any configured one)
and/or a notice file. Signal handlers only set a flag; all I/O happens at the next step boundary. The
deadline comes from the notice (drain time + grace) when there is one, else signal time +
``deadline_after_signal``. The key lines of a job's log are logged at INFO (``job/joblog.py`` says how
they reach stderr). Import-light: standard library only; Slurm commands (and ClusterShell) load only
to requeue.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError, SlurmPreemptError
from slurm_preempt.job import agreement as agreement_mod
from slurm_preempt.job import joblog
from slurm_preempt.job import settings as job_settings
from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore
from slurm_preempt.job.environment import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_INTERVAL,
    JobEnv,
    fresh_notice,
    ledger_writer,
)
from slurm_preempt.job.pacing import Pacer
from slurm_preempt.job.sharded import KIND as SHARDED
from slurm_preempt.job.sharded import ShardedStore, Writer
from slurm_preempt.notice import Notice
from slurm_preempt.notice import deadline as deadline_of

log = logging.getLogger(__name__)


class Run:
    """One attempt of a job. Build it once, early; it installs signal handlers (main thread only).

    Options left at None come from ``[resume]`` in the config (``job/settings.py``). ``log_to_stderr``:
    whether the job's key lines get a stderr handler (None: only when the program configured no
    logging; see ``job/joblog.py``).
    """

    def __init__(
        self,
        checkpoint_dir: Path | str | None = None,
        interval: float | None = None,
        every: int | None = None,
        keep: int | None = None,
        background: bool = False,
        deadline_after_signal: float | None = None,
        signals: tuple[str, ...] | None = None,
        agreement: agreement_mod.Agreement | None = None,
        writer: bool | None = None,
        environ: dict | None = None,
        install_signals: bool = True,
        torch: bool = False,
        log_to_stderr: bool | None = None,
        sharded: bool = False,
        agree_seconds: float | None = None,
    ):
        env = os.environ if environ is None else environ
        folder = checkpoint_dir or env.get(ENV_CHECKPOINT_DIR)
        if not folder:
            raise CheckpointError(f"no checkpoint folder: pass checkpoint_dir= or set {ENV_CHECKPOINT_DIR}")
        self._stop_logging = joblog.show_on_stderr(log_to_stderr)  # first: settings may warn
        settings = job_settings.load()
        self.env = JobEnv.from_environ(environ)
        self.store = CheckpointStore(folder, keep=int(keep or settings.keep))
        if interval is None and every is None:
            interval = _seconds(env.get(ENV_CHECKPOINT_INTERVAL))
        self.interval, self.every, self.background = interval, every, background
        self.torch = torch  # save with torch.save (tensors copied to CPU first) instead of pickle
        self.deadline_after_signal = float(
            settings.deadline_after_signal if deadline_after_signal is None else deadline_after_signal
        )
        self.requeue_exit_code = settings.requeue_exit_code
        self.notice_poll = settings.notice_poll
        self.agreement = agreement or agreement_mod.default(self.env.world)
        self.writer = (self.env.rank == 0) if writer is None else writer
        # Sharded: every rank writes its part of each checkpoint (DCP), one commit makes them visible.
        self.sharded = ShardedStore(folder, self.agreement, self.store.keep) if sharded else None
        seconds = settings.agree_seconds if agree_seconds is None else agree_seconds
        self._pacer = Pacer(seconds if self.agreement.world > 1 else 0.0)
        self._ledger = ledger_writer(self.env)
        self.step = 0
        self.restored: Checkpoint | None = None
        self._last_save = time.monotonic()
        self._signal_at: float | None = None  # wall clock of the first preemption signal
        self._signal_name = ""
        self._stopping = False  # all ranks agreed: take the final checkpoint now
        self._final_saved = False
        self._requeuing = False  # our own `scontrol requeue` sends SIGTERM: not a new preemption
        self._handled_events: set[str] = self._ledger.handled_events()
        self._notice: Notice | None = None
        self._recorded_path: Path | None = None  # the last checkpoint written to the ledger
        self._notice_checked = float("-inf")
        self._previous_handlers: dict[int, Any] = {}
        if install_signals:
            self.install_signals(signals or settings.signals)

    # ------------------------------------------------------------------------------------ facts

    @property
    def restart_count(self) -> int:
        return self.env.restart_count

    @property
    def attempt(self) -> int:
        return self.env.restart_count + 1

    @property
    def is_restart(self) -> bool:
        """A restart by Slurm's count, or a checkpoint already there (e.g. a resubmitted job)."""
        return self.env.restart_count > 0 or self.restored is not None or bool(self.store.steps())

    @property
    def nodes(self) -> int:
        return self.env.num_nodes

    @property
    def previous_nodes(self) -> int | None:
        """Node count of the attempt that wrote the restored checkpoint (None on a first run)."""
        return None if self.restored is None else self.restored.meta.get("num_nodes")

    @property
    def nodes_changed(self) -> bool:
        return self.previous_nodes is not None and self.previous_nodes != self.nodes

    # ------------------------------------------------------------------------------------ restore

    def restore(self, into: dict | None = None) -> Any:
        """The payload of the newest intact checkpoint (falls back past damaged ones), or None.

        Sharded (``Run(sharded=True)``, every rank calls it): ``into`` is the state dict to fill in
        place (tensors, DTensors, FSDP2 shards laid out for this world size; DCP reshards); returns it
        filled, or None on every rank when no checkpoint is complete and loadable everywhere."""
        done = self._restore_sharded(into) if self.sharded is not None else self._restore_whole()
        if done is None:
            return None
        found, payload = done
        self.adopt(found)
        return payload

    def adopt(self, found: Checkpoint) -> None:
        """Take ``found`` as the checkpoint this attempt resumed from (``restore`` does; a framework
        that loads checkpoints itself, such as Lightning, calls it after loading)."""
        self.restored, self.step = found, found.step
        self._handled_events.update(found.meta.get("handled_events", []))
        self._notice_checked = float("-inf")  # re-read the notice with the handled events known
        if self.writer:
            self._say_resumed(found)

    def _restore_whole(self) -> tuple[Checkpoint, Any] | None:
        restored = self.store.restore()  # verified while loaded: each file read once
        if restored is not None and restored[0].kind == SHARDED:
            path = restored[0].path
            raise CheckpointError(f"{path} is sharded (every rank wrote a part): use Run(sharded=True)")
        return restored

    def _restore_sharded(self, into: dict | None) -> tuple[Checkpoint, Any] | None:
        if into is None:
            raise CheckpointError("a sharded restore loads in place: pass restore(into=state_dict)")
        from slurm_preempt.job import dcpstate

        assert self.sharded is not None
        return self.sharded.restore(dcpstate.loader(into))

    def _say_resumed(self, found: Checkpoint) -> None:
        before = self.previous_nodes
        change = f"; the previous attempt had {before}" if before not in (None, self.nodes) else ""
        log.info(
            "resuming from step %d (attempt %d) on %d node(s)%s", found.step, self.attempt, self.nodes, change
        )
        self._ledger.record(
            "resumed_from",
            step=found.step,
            path=str(found.path),
            attempt=self.attempt,
            nodes=self.nodes,
            previous_nodes=before,
            node_list=self.env.node_list,
        )

    # ------------------------------------------------------------------------------------ notices

    def install_signals(self, names: tuple[str, ...]) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("signal handlers can only be installed from the main thread; notices by file only")
            return
        for name in names:
            number = getattr(signal, f"SIG{name.upper().removeprefix('SIG')}")
            self._previous_handlers[number] = signal.signal(number, self._on_signal)

    def restore_signals(self) -> None:
        for number, handler in self._previous_handlers.items():
            signal.signal(number, handler)
        self._previous_handlers.clear()

    def _ignore_signals(self) -> None:
        # Our own `scontrol requeue` SIGTERMs the job. A Python handler would swallow it, but the
        # interpreter puts SIG_DFL back while it shuts down, and a SIGTERM landing then ends the
        # process with 143 instead of the exit code we chose. SIG_IGN survives the shutdown.
        if threading.current_thread() is threading.main_thread():
            for number in self._previous_handlers:
                signal.signal(number, signal.SIG_IGN)

    def _on_signal(self, number, _frame) -> None:
        # A flag only: no I/O, no checkpoint here (that hangs under NCCL/DDP); the step boundary acts.
        if self._requeuing or self._signal_at is not None:
            return
        self._signal_at = time.time()
        self._signal_name = signal.Signals(number).name
        self._notice_checked = float("-inf")  # re-read the notice file at the next step boundary

    @property
    def notice(self) -> Notice | None:
        """The current notice for this attempt (stale ones from earlier attempts are ignored)."""
        now = time.monotonic()
        if now - self._notice_checked >= self.notice_poll:
            self._notice_checked = now
            self._notice = self._fresh_notice()
        return self._notice

    def _fresh_notice(self) -> Notice | None:
        return fresh_notice(self.env, self._handled_events)

    @property
    def notified(self) -> bool:
        """This rank has seen a signal or a notice (not yet agreed with the other ranks)."""
        return self._signal_at is not None or self.notice is not None

    @property
    def deadline(self) -> datetime | None:
        notice = self.notice
        if notice is not None:
            return notice.deadline
        if self._signal_at is not None:
            signalled = datetime.fromtimestamp(self._signal_at, timezone.utc)
            return deadline_of(signalled, self.deadline_after_signal)
        return None

    @property
    def seconds_left(self) -> float | None:
        deadline = self.deadline
        return None if deadline is None else (deadline - datetime.now(timezone.utc)).total_seconds()

    # ------------------------------------------------------------------------------------ saving

    def should_checkpoint(self, step: int) -> bool:
        """True when the interval is due or a preemption is coming. Every rank must call it at every
        step boundary (it exchanges flags with the other ranks)."""
        if self._stopping:
            return not self._final_saved
        every_due = bool(self.every and step % self.every == 0 and step != self.step)  # same on all ranks
        if not self._pacer.due():
            return every_due
        local_stop = int(self.notified and not self._requeuing)
        interval_due = int(bool(self.interval and time.monotonic() - self._last_save >= self.interval))
        stop, due, minus_every = self.agreement.agree([local_stop, interval_due, -self._pacer.proposal()])
        self._pacer.agreed(-minus_every)
        if stop:
            self._stopping = True
            left = self.seconds_left
            when = f"{left:.0f} s left" if left is not None else "no deadline known"
            log.info(
                "%spreemption notice (%s): final checkpoint at step %d, %s",
                self._rank_prefix(), self._cause(), step, when,
            )  # fmt: skip
        return bool(stop or due or every_due)

    def _rank_prefix(self) -> str:
        return f"rank {self.agreement.rank}: " if self.agreement.world > 1 else ""

    def _cause(self) -> str:
        notice = self.notice
        if notice is not None:
            return f"node {notice.node}: {notice.reason}" if notice.reason else f"node {notice.node}"
        return self._signal_name or "another rank"

    def save(self, step: int, state: Any, meta: dict | None = None) -> None:
        """Checkpoint ``state`` at ``step`` (writer rank only; others return at once). The final
        checkpoint after a notice is always synchronous, and every rank learns whether it succeeded."""
        final = self._stopping
        if self.sharded is not None:
            from slurm_preempt.job import dcpstate

            self.save_parts(step, dcpstate.writer(state), dcpstate.FORMAT, meta)
            return
        error = None
        if self.writer:
            try:
                self._write(step, state, dict(meta or {}), background=self.background and not final)
            except CheckpointError as exc:
                error = exc
        if final:
            failed = self.agreement.agree([int(error is not None)])[0]
            if error is None and failed:
                error = CheckpointError(f"the final checkpoint at step {step} failed on the writer rank")
        if error is not None:
            raise error
        self.step, self._last_save = step, time.monotonic()
        self._final_saved = final

    def _write(self, step: int, state: Any, meta: dict, background: bool) -> None:
        done = self.store.wait()  # surfaces a failed background save
        if done is not None and done.path != self._recorded_path:
            self._record_saved(done)
        self._add_meta(meta)
        found: Checkpoint | None = None
        if self.torch:
            found = self.store.save_torch(step, state, meta, background=background)
        elif background:
            self.store.save_async(step, state, meta)
        else:
            found = self.store.save(step, state, meta)
        if found is not None:  # a background save is recorded when it is done (next save or wait)
            self._record_saved(found)

    def _add_meta(self, meta: dict) -> None:
        meta.update(
            job_id=self.env.job_id,
            attempt=self.attempt,
            num_nodes=self.nodes,
            node_list=self.env.node_list,
            handled_events=sorted(self._handled_events | self._current_event()),
        )

    def save_parts(self, step: int, write: Writer, fmt: str = "files", meta: dict | None = None) -> None:
        """Sharded (``Run(sharded=True)``, every rank calls it): ``write(folder)`` writes this rank's
        part of checkpoint ``step`` (e.g. Lightning's ``trainer.save_checkpoint``); one commit makes
        all parts visible; every rank raises CheckpointError if any part failed."""
        if self.sharded is None:
            raise CheckpointError("save_parts needs Run(sharded=True)")
        final, meta = self._stopping, dict(meta or {})
        self._add_meta(meta)
        found = self.sharded.save(step, write, meta, fmt=fmt)
        if self.writer:
            self._record_saved(found)
        self.step, self._last_save, self._final_saved = step, time.monotonic(), final

    def _record_saved(self, found: Checkpoint) -> None:
        self._recorded_path = found.path  # a re-save of a step is another folder (a new generation)
        self._ledger.record(
            "checkpoint_saved",
            step=found.step,
            path=str(found.path),
            bytes=found.nbytes,
            seconds=found.manifest.get("seconds"),
            final=self._stopping,
        )

    def _current_event(self) -> set[str]:
        notice = self.notice if self._stopping else None
        return {notice.event_id} if notice is not None and notice.event_id else set()

    def wait(self) -> None:
        """Wait for a background save; raise its error if it failed."""
        done = self.store.wait()
        if done is not None and done.path != self._recorded_path:
            self._record_saved(done)

    @property
    def preempted(self) -> bool:
        """All ranks agreed a preemption is coming and the final checkpoint is durable."""
        return self._stopping and self._final_saved

    # ------------------------------------------------------------------------------------ requeue

    def requeue_and_exit(self, exit_code: int = 0) -> None:
        """Requeue this job (writer rank) and exit ``exit_code``; when Slurm cannot be asked, fall back:
        exit ``requeue_exit_code`` from the config when set (for sites with ``RequeueExit=``), else wait
        for the node to go away so Slurm requeues a ``--requeue`` job itself."""
        self.wait()
        self._requeuing = True
        self._ignore_signals()
        if not self.writer:
            sys.exit(exit_code)
        if not self.env.job_id:
            log.info(
                "not inside a Slurm job: final checkpoint at step %d saved, exiting %d", self.step, exit_code
            )
            sys.exit(exit_code)
        from slurm_preempt.job.requeue import fallback_exit, requeue_self

        outcome = requeue_self(self.env, self._ledger, step=self.step, events=self._current_event())
        if outcome.ok:
            log.info("%s", outcome.message)
            sys.exit(exit_code)
        fallback_exit(outcome.message, self.requeue_exit_code, self.seconds_left)

    def close(self, finished: bool = True) -> None:
        """The run is over: wait for a background save, put the signal handlers (and logging) back as
        they were. ``finished`` (the default; ``with Run(...)`` passes False when the block raised) says
        the work is done: a notice that came after the last step then does not requeue the job."""
        try:
            self.wait()
            if finished:
                self._say_done()
        finally:
            self.restore_signals()
            close_agreement = getattr(self.agreement, "close", None)
            if close_agreement is not None:
                close_agreement()
            if self._stop_logging is not None:
                self._stop_logging()
                self._stop_logging = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        self.close(finished=exc_type is None)

    def _say_done(self) -> None:
        """Tell the job script that the command finished its work (so a late notice requeues nothing)."""
        done = self.env.done_file
        if done is None or not self.writer or self._stopping:
            return
        try:
            done.touch()
        except OSError as exc:
            log.warning("cannot write %s (%s): a notice now would run the finished job again", done, exc)


def _seconds(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value and value > 0 else None


__all__ = ["Run", "SlurmPreemptError"]
