"""A training loop that survives preemption, using slurm_preempt.Run.

Run it under Slurm with ``--requeue`` (see train_loop.sbatch), or by hand to try it::

    python examples/train_loop.py --checkpoint-dir /tmp/ckpt --steps 300 --result /tmp/result.json

``train_step`` stands in for an optimiser step: deterministic, so a preempted and resumed run must end
with exactly the value of an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import slurm_preempt


def train_step(state: dict, step: int) -> None:
    state["value"] = (state["value"] * 31 + step) % 1_000_003


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint-dir", help="default: $SLURM_PREEMPT_CHECKPOINT_DIR (slurm-preempt sbatch)"
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="pretend each step takes this long")
    parser.add_argument("--result", required=True, help="JSON file written when the run is complete")
    args = parser.parse_args()

    run = slurm_preempt.Run(args.checkpoint_dir, every=args.every)
    state = run.restore() or {"value": 1, "nodes": []}  # None on a first run: start from scratch
    state["nodes"].append(os.environ.get("SLURMD_NODENAME", "local"))
    for step in range(run.step + 1, args.steps + 1):
        time.sleep(args.step_seconds)
        train_step(state, step)
        if run.should_checkpoint(step):  # every N steps, or at once when a preemption notice came
            run.save(step, state)
        if run.preempted:  # the final checkpoint is durable: requeue this job and exit 0
            run.requeue_and_exit()
    run.close()
    result = {"steps": args.steps, "value": state["value"], "attempt": run.attempt, "nodes": state["nodes"]}
    with open(args.result, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
