"""Lightning: a callback that lets a ``lightning.Trainer`` survive preemption (``[lightning]`` extra).

::

    from lightning.pytorch.plugins.environments import SLURMEnvironment
    from slurm_preempt.job.lightning import PreemptionCallback

    preemption = PreemptionCallback(every_n_steps=500)    # folder: $SLURM_PREEMPT_CHECKPOINT_DIR
    trainer = L.Trainer(..., callbacks=[preemption], plugins=[SLURMEnvironment(auto_requeue=False)])
    trainer.fit(model, data, ckpt_path=preemption.resume_path())      # None on a first run

What it changes, and why. Lightning on Slurm (``SLURMEnvironment(auto_requeue=True)``, the default)
answers USR1 by saving an "hpc" checkpoint from inside the signal handler, on every rank at whatever
point each one is (a collective inside a handler: ranks that are mid-step elsewhere hang or mix up
collectives), then requeues the job; SIGTERM only stops it. The callback instead installs the
resume library's handlers once training starts (they replace Lightning's: a flag, nothing more), and at
each batch end the ranks agree (``Run.should_checkpoint``); on a notice all ranks save one checkpoint
at the same batch with ``trainer.save_checkpoint`` (model, optimizer, loops and resumable data
loaders), committed as one sharded checkpoint (DDP: rank 0's file; FSDP: every rank's shards), then
rank 0 requeues the job once and every rank exits 0: the batch script of ``slurm-preempt sbatch``
sees the job already requeued, Lightning never requeues it. On several nodes the script requeues it
once the step has ended, or, for a ``--nodes=MIN-MAX`` job losing a node other than its batch host,
shrinks the job and runs the command again on the nodes that stay (``job/shrink.py``): Lightning then
resumes on fewer ranks (``srun --ntasks-per-node``: Lightning needs ``SLURM_NTASKS_PER_NODE``).
Resuming loads that checkpoint, so a resumable data loader (``state_dict``/``load_state_dict``)
continues at the next batch and no epoch's work is lost; without one Lightning restarts the
interrupted epoch's data (its own warning says so).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from slurm_preempt.errors import CheckpointError, MissingDependencyError
from slurm_preempt.job import agreement as agreement_mod
from slurm_preempt.job import settings as job_settings
from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore
from slurm_preempt.job.environment import ENV_CHECKPOINT_DIR
from slurm_preempt.job.formats import ShardedFormat
from slurm_preempt.job.resume import Run, Wiring
from slurm_preempt.job.sharded import Writer

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    raise MissingDependencyError(
        "Lightning is not installed: pip install 'slurm-preempt[lightning]'"
    ) from None

CKPT_NAME = "lightning.ckpt"


class _TrainerCheckpoint(ShardedFormat):
    """A sharded checkpoint written by ``trainer.save_checkpoint`` on every rank (a collective: DDP's
    rank 0 writes the file, FSDP's ranks write shards); Lightning loads it itself (``ckpt_path=``)."""

    name: ClassVar[str] = "lightning"

    def writer(self, state: Any) -> Writer:
        trainer = state
        return lambda folder: trainer.save_checkpoint(str(folder / CKPT_NAME))

    def loader(self, into: Any) -> Callable[[Checkpoint], Any]:
        raise CheckpointError("Lightning loads its own checkpoints: trainer.fit(ckpt_path=resume_path())")


class PreemptionCallback(Callback):
    """Checkpoint every ``every_n_steps`` optimizer steps (or ``interval`` seconds), and on a preemption
    notice: one checkpoint on all ranks at the same batch, then requeue and exit. ``checkpoint_dir``
    defaults to ``$SLURM_PREEMPT_CHECKPOINT_DIR``; ``settings`` (keep, signals...) to ``[resume]``."""

    def __init__(
        self,
        checkpoint_dir: Path | str | None = None,
        *,
        every_n_steps: int | None = None,
        interval: float | None = None,
        settings: job_settings.ResumeSettings | None = None,
    ):
        folder = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR)
        if not folder:
            raise CheckpointError(f"no checkpoint folder: pass checkpoint_dir= or set {ENV_CHECKPOINT_DIR}")
        self._directory = Path(folder)
        self._every_n_steps, self._interval = every_n_steps, interval
        self._settings = job_settings.load() if settings is None else settings
        self._run: Run | None = None
        self._resumed: Checkpoint | None = None  # what resume_path() chose

    # ------------------------------------------------------------------------------------ resuming

    def resume_path(self) -> str | None:
        """The Lightning checkpoint to pass as ``trainer.fit(ckpt_path=...)``: the newest complete one
        (every file verified, damaged ones skipped), or None on a first run. Every rank calls it before
        ``fit``; ``setup`` then checks that all ranks chose the same one."""
        self._resumed = CheckpointStore(self._directory, keep=self._settings.keep).latest()
        return None if self._resumed is None else str(self._resumed.path / CKPT_NAME)

    # ------------------------------------------------------------------------------------ hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self._run is not None:
            return
        agreement = agreement_mod.default(trainer.world_size)
        self._run = Run(
            self._directory,
            every=self._every_n_steps,
            interval=self._interval,
            format=_TrainerCheckpoint(),
            settings=self._settings,
            # Lightning installs its own signal handlers at fit start: ours go in after them.
            _wiring=Wiring(agreement=agreement, writer=trainer.is_global_zero, install_signals=False),
        )
        mine = self._resumed.step if self._resumed is not None else -1
        newest, minus_oldest = agreement.agree([mine, -mine])
        if newest != -minus_oldest:
            raise CheckpointError(
                f"ranks resume from different checkpoints (steps {-minus_oldest} to {newest}) in "
                f"{self._directory}: is the folder the same shared folder on every node?"
            )
        if self._resumed is not None:
            self._run._adopt(self._resumed)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        assert self._run is not None
        # Replaces Lightning's SIGTERM and USR1 handlers, installed at fit start.
        self._run._signals.install(self._settings.signals)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        run = self._run
        assert run is not None
        step = trainer.global_step
        if run.should_checkpoint(step):
            run.save(step, trainer)  # every rank: trainer.save_checkpoint, one commit
        if run.preempted:
            sys.stdout.flush()
            run.requeue_and_exit()  # SystemExit: Lightning tears down and the process exits 0

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._run is not None and stage == "fit":
            self._run.close()


__all__ = ["CKPT_NAME", "PreemptionCallback"]
