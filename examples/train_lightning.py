"""A Lightning (DDP) training run that survives preemption with slurm_preempt's PreemptionCallback.

Launch one process per node with srun (the plain template: ``slurm-preempt sbatch --nodes 2
--ntasks-per-node 1 -- srun python examples/train_lightning.py ...``) or with torchrun. CPU and gloo,
so it runs anywhere; the data loader is resumable (``state_dict``/``load_state_dict``), so a run
preempted mid-epoch continues at the next batch and ends with exactly the weights of an uninterrupted
run on the same number of ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import lightning as L
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment

from slurm_preempt.job.lightning import PreemptionCallback

SAMPLES, FEATURES, BATCH = 512, 8, 16


class Batches:
    """This rank's share of a fixed data set, in a fixed order per epoch, resumable mid-epoch."""

    def __init__(self, rank: int, world: int):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, FEATURES, generator=generator)
        self.y = self.x @ torch.arange(1.0, FEATURES + 1) + 0.1 * torch.randn(SAMPLES, generator=generator)
        self.rank, self.world = rank, world
        self.epoch, self.done = 0, 0  # the epoch of this pass, the batches of it done

    def __len__(self) -> int:
        return SAMPLES // self.world // BATCH

    def __iter__(self):
        # A new pass after a complete one is the next epoch. Lightning stops asking for batches after
        # len() of them, so the generator never runs past its last yield: count the epoch here.
        if self.done >= len(self):
            self.epoch, self.done = self.epoch + 1, 0
        order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(1000 + self.epoch))
        mine = order[self.rank :: self.world]
        for index in range(self.done, len(self)):
            self.done = index + 1
            picked = mine[index * BATCH : (index + 1) * BATCH]
            yield self.x[picked], self.y[picked]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "done": self.done, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.done = state["epoch"], state["done"]
        saved_world = state.get("world", self.world)
        if saved_world == self.world:
            return
        # Saved on another number of ranks (a job that shrank in place, or came back on fewer nodes):
        # the epoch's first done x saved_world batches of its order are taken; go on after them, in
        # whole batches of this world (a few samples seen twice, none skipped). A finished pass stays one.
        if self.done >= SAMPLES // saved_world // BATCH:
            self.done = len(self)
        else:
            self.done = self.done * saved_world // self.world


class Regression(L.LightningModule):
    def __init__(self, step_seconds: float, notice_at_step: int = 0):
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.step_seconds, self.notice_at_step = step_seconds, notice_at_step

    def training_step(self, batch, batch_idx):
        last_rank = self.trainer.global_rank == self.trainer.world_size - 1
        if self.notice_at_step and self.trainer.global_step == self.notice_at_step and last_rank:
            os.kill(os.getpid(), signal.SIGUSR1)  # a drill without Slurm: the last rank alone is told
        time.sleep(self.step_seconds)  # pretend the step is expensive
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N optimizer steps")
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", help="default: $SLURM_PREEMPT_CHECKPOINT_DIR")
    parser.add_argument("--result", required=True, help="JSON file rank 0 writes at the end")
    parser.add_argument("--notice-at-step", type=int, default=0, help="drill: SIGUSR1 to the last rank then")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", "1")))
    preemption = PreemptionCallback(checkpoint_dir=args.checkpoint_dir, every_n_steps=args.every)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=world // per_node,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=args.epochs,
        callbacks=[preemption],
        plugins=[SLURMEnvironment(auto_requeue=False)] if "SLURM_NTASKS" in os.environ else [],
        use_distributed_sampler=False,  # Batches already hands each rank its share
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Regression(args.step_seconds, args.notice_at_step)
    trainer.fit(model, train_dataloaders=Batches(rank, world), ckpt_path=preemption.resume_path())
    if trainer.is_global_zero:
        weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
        result = {"weights": weights, "steps": trainer.global_step, "world": world}
        with open(args.result, "w") as handle:
            json.dump(result, handle)
    # Lightning leaves its process group up after fit. Left to the interpreter's exit, gloo's threads
    # may still run while C++ tears the group down: "terminate called without an active exception", the
    # rank aborts (exit 134) and the job ends FAILED with its work done (seen on the local cluster).
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is durable and the process group destroyed: leave without the interpreter's finalization,
    # where gloo's C++ threads can still abort a rank ("terminate called without an active exception",
    # SIGABRT) and fail a job whose work is done. Seen after destroy_process_group() too, once in the
    # suite: a two-node torchrun job on the local cluster, after its last step and its result.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
