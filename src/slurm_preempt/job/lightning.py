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
sees the job already requeued, Lightning never requeues it. Resuming loads that checkpoint, so a
resumable data loader (``state_dict``/``load_state_dict``) continues at the next batch and no epoch's
work is lost; without one Lightning restarts the interrupted epoch's data (its own warning says so).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from slurm_preempt.errors import CheckpointError, MissingDependencyError
from slurm_preempt.job import agreement as agreement_mod
from slurm_preempt.job import settings as job_settings
from slurm_preempt.job.checkpoint import Checkpoint, CheckpointStore
from slurm_preempt.job.environment import ENV_CHECKPOINT_DIR
from slurm_preempt.job.resume import Run

try:
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    raise MissingDependencyError(
        "Lightning is not installed: pip install 'slurm-preempt[lightning]'"
    ) from None

FORMAT = "lightning"
CKPT_NAME = "lightning.ckpt"


class PreemptionCallback(Callback):
    """Checkpoint every ``every_n_steps`` optimizer steps (or ``interval`` seconds), and on a preemption
    notice: one checkpoint on all ranks at the same batch, then requeue and exit."""

    def __init__(
        self,
        checkpoint_dir: Path | str | None = None,
        every_n_steps: int | None = None,
        interval: float | None = None,
        keep: int = 3,
        signals: tuple[str, ...] | None = None,
        agree_seconds: float | None = None,
    ):
        import os

        folder = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR)
        if not folder:
            raise CheckpointError(f"no checkpoint folder: pass checkpoint_dir= or set {ENV_CHECKPOINT_DIR}")
        self.directory = Path(folder)
        self.every_n_steps, self.interval, self.keep = every_n_steps, interval, keep
        self.signals, self.agree_seconds = signals, agree_seconds  # signals: [resume] signals
        self.run: Run | None = None
        self._resumed: Checkpoint | None = None  # what resume_path() chose

    # ------------------------------------------------------------------------------------ resuming

    def resume_path(self) -> str | None:
        """The Lightning checkpoint to pass as ``trainer.fit(ckpt_path=...)``: the newest complete one
        (every file verified, damaged ones skipped), or None on a first run. Every rank calls it before
        ``fit``; ``setup`` then checks that all ranks chose the same one."""
        self._resumed = CheckpointStore(self.directory, keep=self.keep).latest()
        return None if self._resumed is None else str(self._resumed.path / CKPT_NAME)

    # ------------------------------------------------------------------------------------ hooks

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.run is not None:
            return
        agreement = agreement_mod.default(trainer.world_size)
        self.run = Run(
            checkpoint_dir=self.directory,
            every=self.every_n_steps,
            interval=self.interval,
            keep=self.keep,
            agreement=agreement,
            writer=trainer.is_global_zero,
            install_signals=False,  # Lightning installs its own at fit start: ours go in after them
            sharded=True,
            agree_seconds=self.agree_seconds,
        )
        mine = self._resumed.step if self._resumed is not None else -1
        newest, minus_oldest = agreement.agree([mine, -mine])
        if newest != -minus_oldest:
            raise CheckpointError(
                f"ranks resume from different checkpoints (steps {-minus_oldest} to {newest}) in "
                f"{self.directory}: is the folder the same shared folder on every node?"
            )
        if self._resumed is not None:
            self.run.adopt(self._resumed)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        assert self.run is not None
        # Replaces Lightning's SIGTERM and USR1 handlers, installed at fit start.
        self.run.install_signals(self.signals or job_settings.load().signals)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        run = self.run
        assert run is not None
        step = trainer.global_step
        if run.should_checkpoint(step):
            run.save_parts(step, lambda folder: self._write(trainer, folder), FORMAT)
        if run.preempted:
            sys.stdout.flush()
            run.requeue_and_exit()  # SystemExit: Lightning tears down and the process exits 0

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.run is not None and stage == "fit":
            self.run.close()

    @staticmethod
    def _write(trainer: Any, folder: Path) -> None:
        # Every rank calls it (a collective): DDP's rank 0 writes the file; FSDP's ranks write shards.
        trainer.save_checkpoint(str(folder / CKPT_NAME))


__all__ = ["CKPT_NAME", "PreemptionCallback"]
