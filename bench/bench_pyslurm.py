"""The watcher's poll reads through pyslurm against the CLI, side by side on one Slurm 25.11 cluster.

    .venv/bin/python bench/bench_pyslurm.py [--quick]     (root; Slurm 25.11's root and its pyslurm,
                                                          `testcluster roots --build 25.11 --pyslurm 25.11`)

A local 25.11 cluster (2 standard + 4 preemptible nodes) with 12 one-CPU jobs, 6 of them on a drained
node; the three reads of a cluster poll (``sinfo -t drain,down``, ``squeue -w <drained> -t
running,configuring``, ``squeue -t pending,requeue_hold``) made N times by each backend, alternated,
inside the release's root (tests/pyslurm_poll.py: pyslurm's libslurm needs the root's glibc). Prints
the median seconds per poll of each and their ratio (pyslurm / CLI). Quick mode: 20 rounds, else 100.

Not at 10,000 nodes: the scale bench (bench_watcher_scale.py) feeds 100,000 polls from the in-memory
Slurm of tests/soak.py, which pyslurm cannot read (it speaks only to a real slurmctld), and its real
cluster has 10 nodes; a 10,000-node slurmctld is not run on this 2-core VM.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from slurm_preempt.rehearsal import pyslurmbuild, versions  # noqa: E402
from slurm_preempt.rehearsal import testcluster as tc  # noqa: E402
from slurm_preempt.rehearsal.clusterspec import BENCH_PORT  # noqa: E402
from slurm_preempt.rehearsal.slurmroot import RootRuntime  # noqa: E402

RELEASE = versions.release("25.11")
PORT = int(os.environ.get("SP_BENCH_PORT", str(BENCH_PORT + 200))) + 60
HELPER = HERE.parent / "tests" / "pyslurm_poll.py"


def _submit(env: dict[str, str], node: str, count: int) -> None:
    for index in range(count):
        argv = ["sbatch", "--parsable", f"--nodelist={node}", "--chdir=/tmp", "--output=/dev/null",
                "-J", f"bench-{node}-{index}", "--comment=slurm-preempt:signal=USR1",
                "--wrap", "sleep 600"]  # fmt: skip
        subprocess.run(argv, env=env, check=True, capture_output=True)


def run(quick: bool = False) -> list[dict]:
    rounds = 20 if quick else 100
    built = pyslurmbuild.ensure(RELEASE)
    with tempfile.TemporaryDirectory(prefix="sp-bench-pyslurm-") as work:
        folder = Path(work)
        spec = tc.ClusterSpec(directory=folder / "cluster", port=PORT, standard=2, preemptible=4, cpus=8,
                              slurm=RELEASE.name)  # fmt: skip
        state = tc.up(spec, timeout=180)
        try:
            env = {**os.environ, **state.env()}
            _submit(env, "pre1", 6)
            _submit(env, "std1", 6)
            subprocess.run(["scontrol", "update", "nodename=pre1", "state=drain", "reason=bench"], env=env,
                           check=True)  # fmt: skip
            copied = folder / "pyslurm"
            shutil.copytree(built, copied, symlinks=True)
            argv = RootRuntime(RELEASE).chroot_argv([sys.executable, str(HELPER), "bench", str(rounds)])
            env["PYTHONPATH"] = f"{copied}{os.pathsep}{HERE.parent / 'src'}"
            done = subprocess.run(argv, env=env, capture_output=True, check=True, timeout=1800)
            times = json.loads(done.stdout)
        finally:
            tc.down(spec.directory)
    cli, pyslurm = times["cli"]["median_s"] * 1000, times["pyslurm"]["median_s"] * 1000
    name = f"poll reads through pyslurm (Slurm 25.11, 6 nodes, 12 jobs, median of {rounds})"
    return [{"name": name, "value": round(pyslurm, 2), "unit": "ms", "baseline": round(cli, 2),
             "ratio": round(pyslurm / cli, 3), "target": "< 1 to be auto's choice",
             "pyslurm": pyslurmbuild.describe(built)}]  # fmt: skip


if __name__ == "__main__":
    import benchargs  # beside this file: sys.path[0] when run as a script

    print(json.dumps(run(quick=benchargs.quick(__doc__)), indent=1))
