"""The hooks on a real local cluster: attempts recorded across removals, failure injection, trust.

This module starts its own cluster with the hooks installed (``testcluster`` with ``hooks=True``, the
same code as ``slurm-preempt hooks install``), on SP_TEST_PORT+50 in SP_TEST_CLUSTER_DIR-hooks, so it
never meets the plain session cluster.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from clusterutil import ClusterHandle, lift_requeue_hold, own_cluster, release, wait_for
from slurm_preempt import ledger
from slurm_preempt.records import history, leadtime, report, texts, timeline
from slurm_preempt.rehearsal import accounting
from slurm_preempt.slurm.commands import Slurm

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
TEST_USER = "sphooks"
PY = sys.executable


def _can_account() -> bool:
    """Real accounting (MariaDB + slurmdbd) when installed. Its absence is not a skip (the tests check
    less without it), so CI, which installs it, fails here on its own."""
    try:
        accounting.check_packages(release())
        return True
    except Exception as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI needs accounting for these tests: {exc}", pytrace=False)
        return False


@pytest.fixture(scope="module")
def hcluster():
    with own_cluster(
        "hooks", standard=1, preemptible=3, cpus=8, hooks=True, accounting=_can_account()
    ) as handle:
        yield handle


@pytest.fixture
def hc(hcluster):
    yield hcluster
    hcluster.reset()


def _submit(hc: ClusterHandle, body: str, *args: str, user: str | None = None) -> str:
    script = hc.workdir / f"job-{len(list(hc.workdir.iterdir()))}.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    argv = ["sbatch", "--parsable", f"--output={hc.workdir}/%j.out", "--open-mode=append", *args, str(script)]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ)
    return done.stdout.strip().split(";")[0]


def _events(hc, job_id, kind=None):
    found = ledger.events(hc.spec.state_dir, job_id)
    return [e for e in found if kind is None or e["kind"] == kind]


def _nodes_ok(hc: ClusterHandle) -> None:
    """No node drained or down because of a hook (the whole point of failure injection)."""
    bad = [(n.name, n.state, n.reason) for n in hc.slurm.nodes() if not n.available]
    assert not bad, f"nodes out of service: {bad}"


RECORD = (
    "import os, sys; from slurm_preempt import ledger; "
    "ledger.record(os.environ['SLURM_PREEMPT_STATE_DIR'], os.environ['SLURM_JOB_ID'], "
    "'checkpoint_saved', source='job', step=int(sys.argv[1]), seconds=0.2)"
)
CHECKPOINTING_JOB = f"""
RECORD="{RECORD}"
restart=${{SLURM_RESTART_COUNT:-0}}
echo "attempt $restart on $SLURMD_NODENAME state=$SLURM_PREEMPT_STATE_DIR"
i=0
while :; do
  i=$((i + 1)); sleep 1
  if [ $((i % 2)) = 0 ]; then
    {PY} -c "$RECORD" $i
  fi
  if [ "$restart" -ge 2 ] && [ $i -ge 3 ]; then exit 0; fi
done
"""


def _requeue_now(hc: ClusterHandle, job_id: str, restarts: int) -> None:
    def started():
        job = hc.job(job_id)
        if job is None:
            return None
        if job.state == "PENDING" and job.restart_count == restarts:
            lift_requeue_hold(hc.slurm, job_id)
        return job if job.state == "RUNNING" and job.restart_count == restarts else None

    wait_for(started, 60, 0.5, what=f"job {job_id} running again (restart {restarts})")


def _drain_and_watch(hc: ClusterHandle, node: str) -> None:
    hc.slurm.drain([node], "preempt")
    argv = [PY, "-m", "slurm_preempt", "watch", "--cluster", "--once", "--grace", "30"]
    argv += ["--state-dir", str(hc.spec.state_dir), "--allow-preemptible-host"]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _check_three(found, removed, final, last_cause: str) -> None:
    assert [a.number for a in found.attempts] == [0, 1, 2]
    assert [a.cause for a in found.attempts] == ["node failure (preempted)"] * 2 + [last_cause]
    assert [a.nodes[0] for a in found.attempts[:2]] == removed
    assert found.attempts[2].nodes == list(final.nodes)
    assert all(a.start and a.end and a.end >= a.start for a in found.attempts)
    assert found.attempts[0].last_checkpoint is not None
    assert 0 < found.attempts[0].lost_seconds < found.attempts[0].run_seconds
    assert found.attempts[2].lost_seconds == 0
    assert found.attempts[1].wait_before is not None and found.attempts[1].wait_before >= 0
    first = found.attempts[0]
    # Slurm records the drain time in whole seconds: it may read up to 1 s before the start.
    assert (
        first.notice_time is not None and first.start - timedelta(seconds=1) <= first.notice_time <= first.end
    )
    assert (first.deadline - first.notice_time).total_seconds() == 30
    assert found.attempts[1].notice_time is None


def test_three_attempts_history_report_timeline(hc, tmp_path):
    job_id = _submit(hc, CHECKPOINTING_JOB, "--constraint=preemptible", "--requeue")
    removed = []
    for restarts in (1, 2):
        job = hc.wait_state(job_id, "RUNNING", 30)
        wanted = 2 * restarts
        wait_for(lambda n=wanted: len(_events(hc, job_id, "checkpoint_saved")) >= n, 30, what="checkpoints")
        removed.append(job.nodes[0])
        if restarts == 1:  # the first time, as a provider does: drain, the watcher tells the job, remove
            _drain_and_watch(hc, job.nodes[0])
        hc.remove_node(job.nodes[0])
        _requeue_now(hc, job_id, restarts)
    final = hc.wait_state(job_id, "COMPLETED", 60)
    wait_for(lambda: len(_events(hc, job_id, "attempt_end")) >= 2 + 2, 30, what="the last attempt_end events")

    found = history.load(job_id, hc.spec.state_dir)  # the ledger alone
    _check_three(found, removed, final, "completed, cancelled or timed out")  # 22.05's epilogs cannot tell
    if hc.spec.accounting:
        merged = history.load(job_id, hc.spec.state_dir, Slurm())
        assert merged.accounting and [a.source for a in merged.attempts] == ["ledger+sacct"] * 3
        _check_three(merged, removed, final, "completed")
        assert merged.submit is not None

    costs = report.build_report(hc.spec.state_dir, report.Prices(cpu_on_demand=1.0, cpu_preemptible=0.5))
    mine = next(j for j in costs.jobs if j.job_id == job_id)
    assert mine.attempts == 3 and mine.preemptions == 2 and mine.completed
    run = sum(a.run_seconds for a in found.attempts) / 3600
    lost = sum(a.lost_seconds for a in found.attempts) / 3600
    assert mine.run_hours == pytest.approx(run) and mine.lost_hours == pytest.approx(lost)
    assert mine.cost_preemptible == pytest.approx(run * 0.5)
    assert mine.cost_on_demand == pytest.approx((run - lost) * 1.0)

    # The lead-time table: the first attempt was told (source slurm) and removed right after.
    print("\n".join(leadtime.lead_lines(costs.leads)))  # shown with -s
    slurm_row = next(row for row in costs.leads if row.source == "slurm")
    assert slurm_row.notices >= 1 and 0 <= slurm_row.worst_seconds <= slurm_row.median_seconds
    assert "lead time per notice source" in texts.report_text(costs)
    told = leadtime.attempt_lead(found.attempts[0])
    assert told is not None and told.source == "slurm" and not told.final_inside
    assert 0 <= told.seconds <= (found.attempts[0].end - found.attempts[0].start).total_seconds()

    if hc.spec.accounting:
        with_sacct = report.build_report(hc.spec.state_dir, report.Prices(), Slurm())
        assert with_sacct.accounting
        merged_cost = next(j for j in with_sacct.jobs if j.job_id == job_id)
        assert (merged_cost.attempts, merged_cost.preemptions) == (3, 2)

    svg = timeline.render_svg(found)
    for attempt in found.attempts:
        assert attempt.nodes[0] in svg
    assert svg.count('class="attempt"') == 3
    assert "<title>notice (drain)</title>" in svg and "<title>deadline</title>" in svg


def test_taskprolog_exports_paths_with_a_bare_environment(hc):
    job_id = _submit(hc, 'echo "N=$SLURM_PREEMPT_NOTICE S=$SLURM_PREEMPT_STATE_DIR"', "--export=NONE")
    hc.wait_state(job_id, "COMPLETED", 30)
    out = (hc.workdir / f"{job_id}.out").read_text()
    state = hc.spec.state_dir
    assert f"N={state}/notices/{job_id}.json S={state}" in out


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", TEST_USER], check=True)
        return pwd.getpwnam(TEST_USER)


def test_user_job_owns_its_folder_and_cannot_forge_or_read_others(hc):
    user = _ensure_user()
    mine = _submit(hc, "sleep 1", user=TEST_USER)
    hc.wait_state(mine, "COMPLETED", 30)
    folder = ledger.job_dir(hc.spec.state_dir, mine)
    info = folder.stat()
    assert (info.st_uid, oct(info.st_mode & 0o777)) == (user.pw_uid, "0o700")
    root_job = _submit(hc, "sleep 1")
    hc.wait_state(root_job, "COMPLETED", 30)
    wait_for(lambda: _events(hc, root_job, "attempt_end"), 20, what="root job's end")
    # As the user: reading root's job folder fails, writing jobs/ fails, forging in its own folder works
    # on disk but the reader does not trust it.
    forge = (
        "import json, os, sys; d=sys.argv[1]; "
        "open(os.path.join(d, '1-x-1-attempt_start.json'), 'w').write(json.dumps("
        "{'kind': 'attempt_start', 'job_id': sys.argv[2], 'time': '2020-01-01T00:00:00Z', "
        "'restart_count': 7}))"
    )
    # The user cannot run root's pyenv: the system python with the source tree (ledger is stdlib only).
    src = str(Path(ledger.__file__).resolve().parents[1])
    as_user = ["runuser", "-u", TEST_USER, "--", "env", f"PYTHONPATH={src}"]
    read_other = subprocess.run(
        [*as_user, "ls", str(ledger.job_dir(hc.spec.state_dir, root_job))], check=False
    )
    assert read_other.returncode != 0
    plant = subprocess.run([*as_user, "mkdir", str(hc.spec.state_dir / "jobs" / "999999999")], check=False)
    assert plant.returncode != 0
    subprocess.run([*as_user, "/usr/bin/python3", "-c", forge, str(folder), mine], check=True)
    subprocess.run(
        [
            *as_user,
            "/usr/bin/python3",
            "-c",
            "import sys; from slurm_preempt import ledger; "
            "ledger.record(sys.argv[1], sys.argv[2], 'checkpoint_saved', source='job', step=1)",
            str(hc.spec.state_dir),
            mine,
        ],
        check=True,
    )
    found = history.load(mine, hc.spec.state_dir)
    assert [a.number for a in found.attempts] == [0]  # the forged restart 7 is not believed
    assert found.ignored_events == 1
    assert len(found.attempts[0].checkpoints) == 1  # the owner's own checkpoint is believed


def _hooks_conf(hc) -> Path:
    return hc.spec.directory / "etc" / "slurm-preempt" / "hooks.conf"


def _run_and_check(hc, expect_recorded: bool) -> str:
    job_id = _submit(hc, "sleep 1")
    hc.wait_state(job_id, "COMPLETED", 30)
    _nodes_ok(hc)
    if expect_recorded:
        wait_for(lambda: _events(hc, job_id, "attempt_end"), 20, what="attempt_end")
    return job_id


@pytest.mark.parametrize("breakage", ["missing", "read-only", "symlink", "user-owned"])
def test_broken_state_folder_never_drains_a_node(hc, tmp_path, breakage):
    conf = _hooks_conf(hc)
    original = conf.read_text()
    target = tmp_path / "state"
    if breakage == "read-only":
        (target / "jobs").mkdir(parents=True)
        hc.everywhere(f"mount -t tmpfs -o ro,size=64k,mode=755 tmpfs {target / 'jobs'}")
    elif breakage == "symlink":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere" / "jobs").symlink_to("/etc")
    elif breakage == "user-owned":
        (target / "jobs").mkdir(parents=True)
        os.chmod(target / "jobs", 0o777)
    conf.write_text(f"state_dir={target}\nlog={tmp_path}/hooks.log\n")
    try:
        _run_and_check(hc, expect_recorded=False)
        assert not list(Path("/etc").glob("*attempt_start.json"))
        assert (tmp_path / "hooks.log").read_text().strip()  # each problem is logged
    finally:
        conf.write_text(original)
        if breakage == "read-only":
            hc.everywhere(f"umount {target / 'jobs'} || true")


def test_full_disk_never_drains_a_node(hc, tmp_path):
    conf = _hooks_conf(hc)
    original = conf.read_text()
    state = tmp_path / "full"
    state.mkdir()
    # Full where the hooks run: a tmpfs of 16 KiB, filled, on the host and in each node's namespace.
    hc.everywhere(
        f"mount -t tmpfs -o size=16k,mode=755 tmpfs {state} && mkdir {state}/jobs && "
        f"{{ head -c 65536 /dev/zero >{state}/filler 2>/dev/null || true; }}"
    )
    try:
        conf.write_text(f"state_dir={state}\nlog={tmp_path}/hooks.log\n")
        _run_and_check(hc, expect_recorded=False)
    finally:
        conf.write_text(original)
        hc.everywhere(f"umount {state} || true")


def test_symlink_planted_in_a_job_folder_is_replaced_not_followed(hc, tmp_path):
    """A user plants symlinks in its own job folder; the epilog's rename replaces them."""
    user = _ensure_user()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(tmp_path, 0o755)
    job_id = _submit(
        hc,
        "d=$SLURM_PREEMPT_STATE_DIR/jobs/$SLURM_JOB_ID; "
        f"for i in $(seq 1 50); do ln -sf {victim} $d/planted-$i.json; done; "
        f"ln -s {victim} $d/.event-x; sleep 1",
        user=TEST_USER,
    )
    hc.wait_state(job_id, "COMPLETED", 30)
    wait_for(lambda: _events(hc, job_id, "attempt_end"), 20, what="attempt_end")
    assert victim.read_text() == "precious\n"
    _nodes_ok(hc)
    assert all(e["_uid"] in (0, user.pw_uid) for e in _events(hc, job_id))
    assert not any(e["_file"].startswith("planted") for e in _events(hc, job_id))


def test_garbage_environment_exits_zero(hc, tmp_path):
    """The installed hooks run with nonsense in every variable and no PATH; always exit 0."""
    etc = hc.spec.directory / "etc"
    garbage = {
        "SLURM_JOB_ID": "../../etc/passwd",
        "SLURM_JOB_UID": "root; rm -rf /",
        "SLURM_JOB_RESTART_COUNT": "$(reboot)",
        "SLURM_JOB_CONSTRAINTS": 'a"b\\c\x01',
        "SLURMD_NODENAME": "\n",
        "IFS": "/",
    }
    for hook in (
        "prolog.d/50-slurm-preempt",
        "epilog.d/50-slurm-preempt",
        "slurm-preempt/epilog-slurmctld",
        "slurm-preempt/taskprolog",
    ):
        done = subprocess.run([str(etc / hook)], env=garbage, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (hook, done.stderr)
        assert done.stdout == ""
    shutil.rmtree(ledger.job_dir(hc.spec.state_dir, "123456789"), ignore_errors=True)
    odd = {**garbage, "SLURM_JOB_ID": "123456789", "SLURM_JOB_RESTART_COUNT": "x"}
    done = subprocess.run([str(etc / "prolog.d/50-slurm-preempt")], env=odd, check=False)
    assert done.returncode == 0
    events = ledger.events(hc.spec.state_dir, "123456789")
    assert [e["kind"] for e in events] == ["attempt_start"]
    assert events[0]["constraints"] == 'a"b\\c' and events[0]["restart_count"] == 0
    json.dumps(events)  # valid JSON came out of the shell


def test_multi_node_attempt_lists_every_node(hc):
    job_id = _submit(hc, "sleep 1", "--nodes=2", "--constraint=preemptible")
    final = hc.wait_state(job_id, "COMPLETED", 30)
    wait_for(
        lambda: len(_events(hc, job_id, "attempt_end")) >= 3,
        20,
        what="both node epilogs and the controller's",
    )
    starts = _events(hc, job_id, "attempt_start")
    assert sorted(e["node"] for e in starts) == sorted(final.nodes) and len(starts) == 2
    [attempt] = history.load(job_id, hc.spec.state_dir).attempts
    assert (
        sorted(attempt.nodes) == sorted(final.nodes) and attempt.cause == "completed, cancelled or timed out"
    )


def test_cancelled_job_is_told_apart_only_with_accounting(hc):
    job_id = _submit(hc, "sleep 60")
    hc.wait_state(job_id, "RUNNING", 30)
    hc.slurm.cancel(job_id)
    wait_for(lambda: len(_events(hc, job_id, "attempt_end")) >= 2, 20, what="attempt_end events")
    assert history.load(job_id, hc.spec.state_dir).attempts[0].cause == "completed, cancelled or timed out"
    if hc.spec.accounting:
        merged = wait_for(lambda: history.load(job_id, hc.spec.state_dir, Slurm()).attempts[0], 20)
        assert merged.cause == "cancelled"


def test_registering_a_cluster_with_slurmdbd_twice_is_no_error(hc):
    """testcluster registered its cluster at start (``Slurm.add_cluster``, as sacct answering shows);
    asked again, sacctmgr's refusal of a known cluster is an answer, not a failure."""
    if not hc.spec.accounting:
        pytest.skip("no accounting here (MariaDB, slurmdbd): a failure under CI")
    slurm = Slurm(timeout=60)
    assert slurm.add_cluster(hc.spec.name) is False
    other = f"sp{os.getpid()}"
    try:
        assert slurm.add_cluster(other) is True
        assert slurm.add_cluster(other) is False
    finally:
        slurm.run(["sacctmgr", "-i", "delete", "cluster", other], timeout=60)
    assert other not in slurm.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).split()
