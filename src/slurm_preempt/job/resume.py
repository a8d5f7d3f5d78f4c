"""The job-side API: restart info, checkpoints, preemption notices, requeue self.

::

    run = slurm_preempt.Run("ckpt", every=50)     # format=TorchFormat(background=True), settings=...
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
they reach stderr). The job author's whole surface is listed in docs/resume.md (a test holds the two
together). Import-light: standard library only; Slurm commands (and ClusterShell) load only to requeue.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError, SlurmPreemptError
from slurm_preempt.job import agreement as agreement_mod
from slurm_preempt.job import joblog
from slurm_preempt.job import settings as job_settings
from slurm_preempt.job.adaptive import AdaptiveInterval, from_environment, is_auto, preemption_history
from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore
from slurm_preempt.job.commit import Owner
from slurm_preempt.job.environment import ENV_CHECKPOINT_DIR, JobEnv
from slurm_preempt.job.formats import Format, PickleFormat, ShardedFormat
from slurm_preempt.job.ledger_writer import LedgerWriter
from slurm_preempt.job.noticewatch import NoticeWatch
from slurm_preempt.job.pacing import Pacer
from slurm_preempt.job.sharded import KIND as SHARDED
from slurm_preempt.job.sharded import ShardedStore, Writer
from slurm_preempt.notice import Notice
from slurm_preempt.records.leadtime import checkpoint_warning

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wiring:
    """How a Run meets its process, for tests, benchmarks and the Lightning callback: not the job
    author's (the defaults are what a job needs). ``environ`` stands for the whole environment:
    Slurm's variables, the defaults of the folder and interval, the configuration (settings and state
    folder) and the owner record of the checkpoint folder are all read from it."""

    environ: Mapping[str, str] | None = None  # None: os.environ
    agreement: agreement_mod.Agreement | None = None  # None: agreement.default(world)
    writer: bool | None = None  # the rank that writes whole checkpoints; None: rank 0
    install_signals: bool = True  # False: the caller installs them later (Lightning, after its own)
    log_to_stderr: bool | None = None  # see job/joblog.py; None: only when nothing configured logging
    clock: Callable[[], float] = time.monotonic  # the cadence's and the notice poll's seconds


class Run:
    """One attempt of a job. Build it once, early; it installs signal handlers (main thread only).

    ``checkpoint_dir`` (default ``$SLURM_PREEMPT_CHECKPOINT_DIR``); the cadence: ``every`` steps and/or
    ``interval`` seconds (neither: ``$SLURM_PREEMPT_CHECKPOINT_INTERVAL``), or ``"auto"``: Daly's from
    this job's measured saves and the live preemption rate (``job/adaptive.py``); ``format``
    (``job/formats.py``, default ``PickleFormat()``); ``settings`` (the ``[resume]`` section, default
    ``job.settings.load()``); ``total_steps``, the steps of the whole run, recorded with each checkpoint
    so the watcher can judge progress against a ``fallback-deadline``. ``_wiring`` is internal.
    """

    def __init__(
        self,
        checkpoint_dir: Path | str | None = None,
        *,
        every: int | None = None,
        interval: float | str | None = None,
        format: Format | None = None,
        settings: job_settings.ResumeSettings | None = None,
        total_steps: int | None = None,
        _wiring: Wiring | None = None,
    ):
        wiring = Wiring() if _wiring is None else _wiring
        env = os.environ if wiring.environ is None else wiring.environ
        folder = checkpoint_dir or env.get(ENV_CHECKPOINT_DIR)
        if not folder:
            raise CheckpointError(f"no checkpoint folder: pass checkpoint_dir= or set {ENV_CHECKPOINT_DIR}")
        self._clock = wiring.clock
        self._stop_logging = joblog.show_on_stderr(wiring.log_to_stderr)  # first: settings may warn
        self._settings = job_settings.load(wiring.environ) if settings is None else settings
        self._env = JobEnv.from_environ(wiring.environ)
        self._format: Format = PickleFormat() if format is None else format
        owner = None if wiring.environ is None else Owner.current(environ=dict(wiring.environ))
        whole = None if isinstance(self._format, ShardedFormat) else self._format
        self._store = CheckpointStore(folder, keep=self._settings.keep, owner=owner, format=whole)
        if interval is None and every is None:
            interval = from_environment(env)
        self._agreement = wiring.agreement or agreement_mod.default(self._env.world)
        self._writer = (self._env.rank == 0) if wiring.writer is None else wiring.writer
        self._ledger = LedgerWriter.for_job(self._env)
        self._adaptive: AdaptiveInterval | None = None
        if is_auto(interval):
            record = self._ledger.record if self._writer else (lambda *_a, **_k: None)
            history = preemption_history(self._env.state_dir, self._env.job_id, self._env.restart_count)
            self._adaptive = AdaptiveInterval(self._env.state_dir, self._env.num_nodes, env, record, history)
            interval = self._adaptive.update()  # at each attempt, from the rate published now
        self._interval: float | None = None if isinstance(interval, str) else interval
        self._total_steps = total_steps if isinstance(total_steps, int) and total_steps > 0 else None
        self._every = every
        # Sharded: every rank writes its part of each checkpoint, one commit makes them visible.
        self._sharded = (
            ShardedStore(folder, self._agreement, self._store.keep, owner) if self._format.sharded else None
        )
        seconds = self._settings.agree_seconds
        self._pacer = Pacer(seconds if self._agreement.world > 1 else 0.0)
        self._step = 0
        self._restored: Checkpoint | None = None
        self._last_save = self._clock()
        self._save_seconds: float | None = None  # how long the last recorded checkpoint took
        self._handled_events: set[str] = self._ledger.handled_events()
        self._watch = NoticeWatch(
            self._env,
            self._handled_events,
            notice_poll=self._settings.notice_poll,
            deadline_after_signal=self._settings.deadline_after_signal,
            clock=self._clock,
        )
        self._signals = self._watch.signals
        self._stopping = False  # all ranks agreed: take the final checkpoint now
        self._final_saved = False
        self._recorded_path: Path | None = None  # the last checkpoint written to the ledger
        if wiring.install_signals:
            self._signals.install(self._settings.signals)

    # ------------------------------------------------------------------------------------ where it stands

    @property
    def checkpoint_dir(self) -> Path:
        return self._store.directory

    @property
    def interval(self) -> float | None:
        """Seconds between periodic checkpoints in force (given, ``$SLURM_PREEMPT_CHECKPOINT_INTERVAL``,
        or with ``auto`` the one taken at the last save)."""
        return self._interval

    @property
    def step(self) -> int:
        """The step of the last checkpoint restored or saved (0 on a first run)."""
        return self._step

    @property
    def restored(self) -> Checkpoint | None:
        """The checkpoint this attempt resumed from (None on a first run)."""
        return self._restored

    # ------------------------------------------------------------------------------------ facts

    @property
    def restart_count(self) -> int:
        return self._env.restart_count

    @property
    def attempt(self) -> int:
        return self._env.restart_count + 1

    @property
    def is_restart(self) -> bool:
        """A restart by Slurm's count, or a checkpoint already there (e.g. a resubmitted job)."""
        return self._env.restart_count > 0 or self._restored is not None or bool(self._store.steps())

    @property
    def nodes(self) -> int:
        return self._env.num_nodes

    @property
    def previous_nodes(self) -> int | None:
        """Node count of the attempt that wrote the restored checkpoint (None on a first run)."""
        return None if self._restored is None else self._restored.meta.get("num_nodes")

    @property
    def nodes_changed(self) -> bool:
        return self.previous_nodes is not None and self.previous_nodes != self.nodes

    # ------------------------------------------------------------------------------------ restore

    def restore(self, into: dict | None = None, *, writable: bool = False) -> Any:
        """The payload of the newest intact checkpoint (falls back past damaged ones), or None.
        Bytes and arrays come back as read-only views of the files (no copy); ``writable``: copies.

        Sharded (``format=ShardedFormat()``, every rank calls it): ``into`` is the state dict to fill in
        place (tensors, DTensors, FSDP2 shards laid out for this world size; DCP reshards); returns it
        filled, or None on every rank when no checkpoint is complete and loadable everywhere. Raises
        CheckpointError when a whole format finds a sharded checkpoint or a sharded restore has no
        ``into``; MissingDependencyError when it needs torch and there is none."""
        sharded = self._sharded is not None
        done = self._restore_sharded(into) if sharded else self._restore_whole(writable)
        if done is None:
            return None
        found, payload = done
        self._adopt(found)
        return payload

    def _adopt(self, found: Checkpoint) -> None:
        """Take ``found`` as the checkpoint this attempt resumed from (``restore`` does; the Lightning
        callback, whose trainer loads the checkpoint itself, calls it after choosing one)."""
        self._restored, self._step = found, found.step
        self._handled_events.update(found.meta.get("handled_events", []))
        self._watch.reread()  # with the handled events known
        if self._writer:
            self._say_resumed(found)

    def _restore_whole(self, writable: bool) -> tuple[Checkpoint, Any] | None:
        restored = self._store.restore(writable)  # verified while loaded: each file read once
        if restored is not None and restored[0].kind == SHARDED:
            path = restored[0].path
            raise CheckpointError(
                f"{path} is sharded (every rank wrote a part): use Run(format=ShardedFormat())"
            )
        return restored

    def _restore_sharded(self, into: dict | None) -> tuple[Checkpoint, Any] | None:
        if into is None:
            raise CheckpointError("a sharded restore loads in place: pass restore(into=state_dict)")
        assert self._sharded is not None and isinstance(self._format, ShardedFormat)
        return self._sharded.restore(self._format.loader(into))

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
            node_list=self._env.node_list,
        )

    # ------------------------------------------------------------------------------------ notices

    @property
    def notice(self) -> Notice | None:
        """The current notice for this attempt (stale ones from earlier attempts are ignored)."""
        return self._watch.notice

    @property
    def notified(self) -> bool:
        """This rank has seen a signal or a notice (not yet agreed with the other ranks)."""
        return self._watch.notified

    @property
    def deadline(self) -> datetime | None:
        """The notice's deadline (drain time + grace), else the signal's time + ``deadline_after_signal``."""
        return self._watch.deadline

    @property
    def seconds_left(self) -> float | None:
        return self._watch.seconds_left

    # ------------------------------------------------------------------------------------ saving

    def should_checkpoint(self, step: int) -> bool:
        """True when the interval is due or a preemption is coming. Every rank must call it at every
        step boundary (it exchanges flags with the other ranks)."""
        if self._stopping:
            return not self._final_saved
        every_due = bool(self._every and step % self._every == 0 and step != self._step)  # same on all ranks
        if not self._pacer.due():
            return every_due
        local_stop = int(self.notified and not self._signals.muted)
        interval_due = int(bool(self._interval and self._clock() - self._last_save >= self._interval))
        stop, due, minus_every = self._agreement.agree([local_stop, interval_due, -self._pacer.proposal()])
        self._pacer.agreed(-minus_every)
        if stop:
            self._stopping = True
            left = self.seconds_left
            when = f"{left:.0f} s left" if left is not None else "no deadline known"
            log.info(
                "%spreemption notice (%s): final checkpoint at step %d, %s",
                self._rank_prefix(), self._watch.cause(), step, when,
            )  # fmt: skip
            self._warn_if_slow()
        return bool(stop or due or every_due)

    def _warn_if_slow(self) -> None:
        """A checkpoint that takes more than half the warning this notice's source gives (its grace)."""
        notice = self.notice
        if notice is not None and self._save_seconds is not None:
            lead = (notice.deadline - notice.drain_time).total_seconds()
            warning = checkpoint_warning(self._save_seconds, lead, notice.source)
            if warning:
                log.warning("%s%s", self._rank_prefix(), warning)

    def _rank_prefix(self) -> str:
        return f"rank {self._agreement.rank}: " if self._agreement.world > 1 else ""

    def save(self, step: int, state: Any, meta: dict | None = None) -> None:
        """Checkpoint ``state`` at ``step`` in the run's format: whole formats on the writer rank only
        (others return at once), periodic saves in the background when the format says so; sharded on
        every rank (each writes its part, one commit). The final checkpoint after a notice is always
        synchronous, and every rank learns whether it succeeded. Raises CheckpointError on every rank
        when a sharded or final save failed (on the writer rank for a periodic one); the previous
        checkpoint stays the newest."""
        fmt, began = self._format, time.monotonic()
        if isinstance(fmt, ShardedFormat):
            self._save_parts(step, fmt.writer(state), fmt.name, meta)
            self._measured(began)
            return
        final = self._stopping
        error = None
        if self._writer:
            try:
                self._write(step, state, dict(meta or {}), background=fmt.background and not final)
            except CheckpointError as exc:
                error = exc
        if final:
            failed = self._agreement.agree([int(error is not None)])[0]
            if error is None and failed:
                error = CheckpointError(f"the final checkpoint at step {step} failed on the writer rank")
        if error is not None:
            raise error
        self._step, self._last_save = step, self._clock()
        self._final_saved = final
        self._measured(began)

    def _measured(self, began: float) -> None:
        """With ``interval="auto"``: this save held training since ``began``; take the interval again."""
        if self._adaptive is not None:
            self._interval = self._adaptive.saved(time.monotonic() - began)

    def _write(self, step: int, state: Any, meta: dict, background: bool) -> None:
        done = self._store.wait()  # surfaces a failed background save
        if done is not None and done.path != self._recorded_path:
            self._record_saved(done)
        self._add_meta(meta)
        found = self._store.save(step, state, meta, background=background)
        if found is not None:  # a background save is recorded when it is done (next save or wait)
            self._record_saved(found)

    def _add_meta(self, meta: dict) -> None:
        meta.update(
            job_id=self._env.job_id,
            attempt=self.attempt,
            num_nodes=self.nodes,
            node_list=self._env.node_list,
            handled_events=sorted(self._handled_events | self._current_event()),
        )

    def _save_parts(self, step: int, write: Writer, fmt: str, meta: dict | None) -> None:
        """Sharded, every rank: ``write(folder)`` writes this rank's part of checkpoint ``step``; one
        commit makes all parts visible; every rank raises CheckpointError if any part failed."""
        assert self._sharded is not None
        final, meta = self._stopping, dict(meta or {})
        self._add_meta(meta)
        found = self._sharded.save(step, write, meta, fmt=fmt)
        if self._writer:
            self._record_saved(found)
        self._step, self._last_save, self._final_saved = step, self._clock(), final

    def _record_saved(self, found: Checkpoint) -> None:
        self._recorded_path = found.path  # a re-save of a step is another folder (a new generation)
        self._ledger.checkpoint_saved(found, final=self._stopping, total_steps=self._total_steps)
        seconds = found.manifest.get("seconds")
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
            self._save_seconds = float(seconds)

    def _current_event(self) -> set[str]:
        return self._watch.event_acted_on() if self._stopping else set()

    def wait(self) -> None:
        """Wait for a background save; raise CheckpointError if it failed."""
        done = self._store.wait()
        if done is not None and done.path != self._recorded_path:
            self._record_saved(done)

    @property
    def preempted(self) -> bool:
        """All ranks agreed a preemption is coming and the final checkpoint is durable."""
        return self._stopping and self._final_saved

    # ------------------------------------------------------------------------------------ requeue

    def requeue_and_exit(self, exit_code: int = 0) -> None:
        """Requeue this job (writer rank) and exit ``exit_code``; when Slurm cannot be asked, fall back:
        exit ``requeue_exit_code`` from the settings when set (for sites with ``RequeueExit=``), else wait
        for the node to go away so Slurm requeues a ``--requeue`` job itself. Raises SystemExit only
        (CheckpointError first if a background save failed)."""
        self.wait()
        self._signals.muted = True
        self._signals.ignore()
        if not self._writer:
            sys.exit(exit_code)
        from slurm_preempt.job.requeue import leave

        leave(
            self._env,
            self._ledger,
            step=self._step,
            events=self._current_event(),
            exit_code=exit_code,
            requeue_exit_code=self._settings.requeue_exit_code,
            seconds_left=lambda: self.seconds_left,
        )

    def close(self, finished: bool = True) -> None:
        """The run is over: wait for a background save, put the signal handlers (and logging) back as
        they were. ``finished`` (the default; ``with Run(...)`` passes False when the block raised) says
        the work is done: a notice that came after the last step then does not requeue the job."""
        try:
            self.wait()
            if finished:
                self._say_done()
        finally:
            self._signals.restore()
            close_agreement = getattr(self._agreement, "close", None)
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
        done = self._env.done_file
        if done is None or not self._writer or self._stopping:
            return
        try:
            done.touch()
        except OSError as exc:
            log.warning("cannot write %s (%s): a notice now would run the finished job again", done, exc)


__all__ = ["Run", "SlurmPreemptError", "Wiring"]
