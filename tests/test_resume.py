"""The job-side Run API and the ``slurm-preempt resume`` commands (no cluster needed; the real-cluster
drill is in test_resume_cluster.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from apisurface import actual, documented
from clusterutil import wait_for
from slurm_preempt import ledger
from slurm_preempt.cli import main
from slurm_preempt.job import settings as job_settings
from slurm_preempt.job.checkpoint import CheckpointStore, step_name
from slurm_preempt.job.formats import PickleFormat, TorchFormat
from slurm_preempt.job.resume import Run, Wiring
from slurm_preempt.notice import Notice, from_text, notice_path, utcnow, write_notice

HEAVY = ("click", "jinja2", "psutil", "ClusterShell", "torch")


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A job environment: id 123, state dir, no config of the developer's leaking in (the process's
    environment says the same, for the CLI and the scripts run here)."""
    config = {"SLURM_PREEMPT_CONFIG": str(tmp_path / "config.toml"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    (tmp_path / "config.toml").write_text("[resume]\ndeadline_after_signal = 30\nnotice_poll = 0\n")
    for name, value in config.items():
        monkeypatch.setenv(name, value)
    state = tmp_path / "state"
    return {
        "SLURM_JOB_ID": "123",
        "SLURM_PREEMPT_STATE_DIR": str(state),
        "SLURM_JOB_NUM_NODES": "1",
        **config,
    }


def _run(tmp_path, environ, **kwargs) -> Run:
    # pytest puts handlers on the root logger, so a Run would leave its lines to them: ask for stderr.
    return Run(tmp_path / "ckpt", _wiring=Wiring(environ=environ, log_to_stderr=True), **kwargs)


def _settings(environ, **changes) -> job_settings.ResumeSettings:
    """The job's ``[resume]`` settings with ``changes``, as a job author would write them."""
    return replace(job_settings.load(environ), **changes)


def _notice(environ, drain_ago: float = 0, grace: float = 60) -> Notice:
    notice = Notice.for_drain(
        "123", "pre1", "reclaimed", "test", utcnow() - timedelta(seconds=drain_ago), grace
    )
    write_notice(notice_path(environ["SLURM_PREEMPT_STATE_DIR"], "123"), notice)
    return notice


def _kinds(environ, kind):
    return [e for e in ledger.events(environ["SLURM_PREEMPT_STATE_DIR"], "123") if e["kind"] == kind]


# ------------------------------------------------------------------------------ import-light


def test_import_is_light_and_installs_nothing():
    code = (
        "import signal, slurm_preempt; [getattr(slurm_preempt, n) for n in slurm_preempt.__all__];"
        "import slurm_preempt.job.shell, slurm_preempt.job.agreement, slurm_preempt.job.interval;"
        "import slurm_preempt.job.requeue, slurm_preempt.job.checkpoint;"
        "assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL;"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "slurm_preempt" in imported
    assert not imported & set(HEAVY), imported & set(HEAVY)


# ------------------------------------------------------------------------------ restart facts


def test_first_run_restores_nothing(tmp_path, job):
    with _run(tmp_path, job) as run:
        assert run.restore() is None
        assert (run.attempt, run.step, run.is_restart, run.previous_nodes) == (1, 0, False, None)


def test_restart_restores_state_step_and_node_counts(tmp_path, job, capsys):
    with _run(tmp_path, {**job, "SLURM_JOB_NUM_NODES": "2"}, every=5) as run:
        for step in range(1, 13):
            if run.should_checkpoint(step):
                run.save(step, {"step": step})
    again = {**job, "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NUM_NODES": "1"}
    with _run(tmp_path, again) as run:
        assert run.restore() == {"step": 10}
        assert (run.step, run.attempt, run.is_restart) == (10, 2, True)
        assert (run.nodes, run.previous_nodes, run.nodes_changed) == (1, 2, True)
    assert (
        "resuming from step 10 (attempt 2) on 1 node(s); the previous attempt had 2"
        in capsys.readouterr().err
    )
    resumed = _kinds(job, "resumed_from")
    assert resumed[0]["step"] == 10 and resumed[0]["previous_nodes"] == 2 and resumed[0]["nodes"] == 1
    assert [e["step"] for e in _kinds(job, "checkpoint_saved")] == [5, 10]


def test_damaged_newest_checkpoint_falls_back(tmp_path, job, capsys):
    with _run(tmp_path, job, every=1) as run:
        for step in (1, 2):
            run.should_checkpoint(step)
            run.save(step, {"step": step})
    (tmp_path / "ckpt" / step_name(2) / "MANIFEST.json").unlink()
    with _run(tmp_path, job) as run:
        assert run.restore() == {"step": 1}
    assert "damaged" in capsys.readouterr().err


# ------------------------------------------------------------------------------ notices


def test_notice_file_triggers_a_final_synchronous_checkpoint(tmp_path, job):
    with _run(tmp_path, job, every=100, format=PickleFormat(background=True)) as run:
        assert not run.should_checkpoint(1)
        notice = _notice(job, grace=60)
        assert run.should_checkpoint(2)
        assert run.deadline == notice.deadline.replace(microsecond=0) and run.seconds_left <= 60
        run.save(2, {"step": 2})
        assert run.preempted  # durable now, though background saves are on
        assert CheckpointStore(tmp_path / "ckpt").latest().step == 2
    assert [e["final"] for e in _kinds(job, "checkpoint_saved")] == [True]


def test_signal_sets_a_flag_and_a_deadline_after_the_signal(tmp_path, job):
    with _run(tmp_path, job, settings=_settings(job, deadline_after_signal=30)) as run:
        before = utcnow()
        os.kill(os.getpid(), signal.SIGUSR1)
        after = utcnow()
        assert run.notified and run.notice is None
        # The deadline counts from the signal, whenever a busy machine lets this line run.
        assert before + timedelta(seconds=30) <= run.deadline <= after + timedelta(seconds=30)
        assert run.seconds_left <= 30
        assert run.should_checkpoint(7)
        assert list(CheckpointStore(tmp_path / "ckpt").steps()) == []  # the handler did no I/O
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers restored on exit


def test_sigterm_of_our_own_requeue_is_not_a_new_preemption(tmp_path, job):
    with _run(tmp_path, job) as run:
        run._signals.muted = True  # as requeue_and_exit sets it before `scontrol requeue`
        os.kill(os.getpid(), signal.SIGTERM)
        assert not run.notified


def test_stale_notices_of_earlier_attempts_are_ignored(tmp_path, job):
    _notice(job, drain_ago=3600, grace=300)  # drained (and over) long before this process started
    with _run(tmp_path, job) as run:
        assert run.notice is None and not run.should_checkpoint(1)
    notice = _notice(job)
    with _run(tmp_path, job) as run:  # a fresh notice: final checkpoint remembers its event
        assert run.should_checkpoint(3)
        run.save(3, {"step": 3})
    with _run(tmp_path, {**job, "SLURM_RESTART_COUNT": "1"}) as run:
        assert run.restore() == {"step": 3}
        assert run.notice is None, "the resumed attempt acted on the notice its predecessor handled"
    assert notice.event_id in CheckpointStore(tmp_path / "ckpt").latest().meta["handled_events"]


def test_time_interval(tmp_path, job):
    now = [1000.0]
    wiring = Wiring(environ=job, log_to_stderr=True, clock=lambda: now[0])
    with Run(tmp_path / "ckpt", interval=60, _wiring=wiring) as run:
        now[0] += 59.9
        assert not run.should_checkpoint(1)
        now[0] += 0.1
        assert run.should_checkpoint(2)
        run.save(2, {"step": 2})
        now[0] += 30
        assert not run.should_checkpoint(3)  # the interval counts from the last save


def test_unwritable_ledger_warns_once_and_the_job_goes_on(tmp_path, job, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with _run(tmp_path, {**job, "SLURM_PREEMPT_STATE_DIR": str(blocker)}, every=1) as run:
        for step in (1, 2, 3):
            run.should_checkpoint(step)
            run.save(step, step)
    err = capsys.readouterr().err
    assert err.count("cannot write the ledger") == 1
    assert CheckpointStore(tmp_path / "ckpt").latest().step == 3


def test_background_save_errors_surface_on_the_next_save(tmp_path, job):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = Run(blocker / "ckpt", every=1, format=PickleFormat(background=True), _wiring=Wiring(environ=job))
    run.should_checkpoint(1)
    run.save(1, b"x")
    with pytest.raises(Exception, match="background save failed"):
        run.save(2, b"y")
    run._signals.restore()


REQUEUE_SCRIPT = """
import sys
from slurm_preempt import Run
run = Run(sys.argv[1])
run.save(1, b"state")
run.requeue_and_exit()
"""


def test_requeue_without_scontrol_falls_back_to_the_configured_exit_code(tmp_path, job):
    (tmp_path / "config.toml").write_text("[resume]\nrequeue_exit_code = 85\n")
    script = tmp_path / "job.py"
    script.write_text(REQUEUE_SCRIPT)
    env = {**os.environ, **job, "PATH": "/nonexistent", "SLURM_PREEMPT_CONFIG": str(tmp_path / "config.toml")}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 85
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "scontrol" in lines[0] and "RequeueExit" in lines[0], proc.stderr
    assert not _kinds(job, "requeued")


def test_on_several_nodes_the_writer_leaves_the_requeue_to_the_job_script(tmp_path, job):
    """The script names a file (SLURM_PREEMPT_SCRIPT_REQUEUES): the writer makes it and exits 0 without
    asking Slurm (PATH has no scontrol); the script requeues once the step has ended."""
    script = tmp_path / "job.py"
    script.write_text(REQUEUE_SCRIPT)
    marker = tmp_path / "ckpt" / ".requeue-1234-1"
    env = {**os.environ, **job, "PATH": "/nonexistent", "SLURM_PREEMPT_SCRIPT_REQUEUES": str(marker)}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and marker.exists(), proc.stderr
    assert "the job script requeues the job once its steps end" in proc.stderr
    assert not _kinds(job, "requeued")


def test_a_requeue_file_that_cannot_be_made_falls_back_to_requeueing_here(tmp_path, job):
    (tmp_path / "config.toml").write_text("[resume]\nrequeue_exit_code = 85\n")
    script = tmp_path / "job.py"
    script.write_text(REQUEUE_SCRIPT)
    env = {**os.environ, **job, "PATH": "/nonexistent", "SLURM_PREEMPT_CONFIG": str(tmp_path / "config.toml"),
           "SLURM_PREEMPT_SCRIPT_REQUEUES": str(tmp_path / "missing" / "folder" / ".requeue")}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 85, proc.stderr  # it asked Slurm itself: no scontrol, the site's exit code
    assert "cannot tell the job script to requeue" in proc.stderr and "RequeueExit" in proc.stderr


def test_requeue_outside_slurm_just_exits_after_the_final_checkpoint(tmp_path, job):
    script = tmp_path / "job.py"
    script.write_text(REQUEUE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "not inside a Slurm job" in proc.stderr


# ------------------------------------------------------------------------------ CLI


def _cli(args, env):
    return CliRunner().invoke(main, ["resume", *args], env=env, catch_exceptions=False)


def test_cli_env_save_latest(tmp_path, job):
    ckpt = str(tmp_path / "ckpt")
    first = _cli(["env", "-d", ckpt], job)
    assert "export SLURM_PREEMPT_RESUME_FLAG=''" in first.output
    assert "export SLURM_PREEMPT_RESTART_COUNT=0" in first.output
    (tmp_path / "state.txt").write_text("41")
    saved = _cli(["save", "-d", ckpt, "--step", "41", str(tmp_path / "state.txt")], job)
    assert saved.exit_code == 0 and saved.output.strip().endswith(step_name(41))
    again = _cli(["env", "-d", ckpt], {**job, "SLURM_RESTART_COUNT": "1"})
    assert "export SLURM_PREEMPT_RESUME_FLAG=1" in again.output
    assert "export SLURM_PREEMPT_LATEST_STEP=41" in again.output
    assert f"export SLURM_PREEMPT_LATEST_CHECKPOINT={ckpt}/{step_name(41)}" in again.output
    latest = _cli(["latest", "-d", ckpt, "--json"], job)
    assert json.loads(latest.output)["step"] == 41
    assert _kinds(job, "checkpoint_saved")[0]["step"] == 41


def test_cli_errors_are_one_line(tmp_path, job):
    none = _cli(["latest", "-d", str(tmp_path / "none")], job)
    assert none.exit_code == 6 and len(none.output.strip().splitlines()) == 1
    missing = _cli(["save", "-d", str(tmp_path / "c"), "--step", "1", str(tmp_path / "missing")], job)
    assert missing.exit_code == 2 and "Traceback" not in missing.output
    bad = _cli(["interval", "-c", "-1", "-m", "10"], job)
    assert bad.exit_code == 2 and bad.output.startswith("Error:")


def test_cli_requeue_outside_a_job_says_so(job):
    result = _cli(["requeue"], {k: v for k, v in job.items() if k != "SLURM_JOB_ID"} | {"SLURM_JOB_ID": ""})
    assert result.exit_code == 4 and "not inside a Slurm job" in result.output


def test_cli_interval_and_help_examples(job):
    assert "young 1610.0 s" in _cli(["interval", "-c", "90", "-m", "14400"], job).output
    for command in ("env", "wait", "requeue", "save", "latest", "interval"):
        assert "Example" in _cli([command, "--help"], job).output


def _wait(args, env, timeout=30):
    cmd = [sys.executable, "-m", "slurm_preempt", "resume", "wait", *args]
    return subprocess.Popen(
        cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_cli_wait_exit_codes(tmp_path, job):
    timed_out = _wait(["--timeout", "0.3"], job)
    assert timed_out.wait(30) == 7
    gone = subprocess.Popen(["true"])
    gone.wait()
    ended = _wait(["--pid", str(gone.pid)], job)
    assert ended.wait(30) == 1
    waiting = _wait(["--timeout", "30"], job)
    threading.Timer(0.5, _notice, args=(job,)).start()
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert "notice for node pre1, deadline" in out


def _catches(pid: int, number: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (number - 1) & 1)
    return False


def test_cli_wait_returns_on_a_signal(job):
    waiting = _wait(["--timeout", "30"], job)
    # a signal before the handler is installed would kill it: wait until /proc says it is caught
    wait_for(lambda: _catches(waiting.pid, signal.SIGUSR1), 30, interval=0.05, what="the USR1 handler")
    waiting.send_signal(signal.SIGUSR1)
    out, _err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and out.startswith("SIGUSR1, deadline")


def test_cli_wait_deadline_after_a_bare_signal(job):
    waiting = _wait(["--timeout", "30", "--deadline-after-signal", "600"], job)
    wait_for(lambda: _catches(waiting.pid, signal.SIGUSR1), 30, interval=0.05, what="the USR1 handler")
    waiting.send_signal(signal.SIGUSR1)
    out, _err = waiting.communicate(timeout=30)
    deadline = from_text(out.strip().rsplit(" ", 1)[-1])
    assert waiting.returncode == 0
    assert 300 < (deadline - utcnow()).total_seconds() <= 600  # not the default 30


def test_examples_are_shipped():
    root = Path(__file__).resolve().parents[1] / "examples"
    assert (root / "train_loop.py").exists() and (root / "train_loop.sbatch").exists()


def test_torch_state_through_run(tmp_path, job):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install slurm-preempt[torch])")
    model = torch.nn.Linear(3, 1)
    with _run(tmp_path, job, every=2, format=TorchFormat(background=True)) as run:
        for step in (1, 2):
            if run.should_checkpoint(step):
                run.save(step, {"model": model.state_dict(), "step": step})
    with _run(tmp_path, job, format=TorchFormat()) as run:
        restored = run.restore()
    assert restored["step"] == 2 and torch.equal(restored["model"]["bias"], model.bias.detach())
    assert [e["step"] for e in _kinds(job, "checkpoint_saved")] == [2]


def test_defaults_from_the_sbatch_script_environment(tmp_path, job):
    env = {
        **job,
        "SLURM_PREEMPT_CHECKPOINT_DIR": str(tmp_path / "c"),
        "SLURM_PREEMPT_CHECKPOINT_INTERVAL": "600",
    }
    with Run(_wiring=Wiring(environ=env)) as run:
        assert run.checkpoint_dir == tmp_path / "c" and run.interval == 600.0
    with pytest.raises(Exception, match="SLURM_PREEMPT_CHECKPOINT_DIR"):
        Run(_wiring=Wiring(environ=job))
    saved = _cli(
        ["save", "--step", "1", __file__], {**job, "SLURM_PREEMPT_CHECKPOINT_DIR": str(tmp_path / "c")}
    )
    assert saved.exit_code == 0 and str(tmp_path / "c") in saved.output


LOG_SCRIPT = """
import logging, sys
from slurm_preempt import Run
from slurm_preempt.job.resume import Wiring
if sys.argv[2] == "basicConfig":
    logging.basicConfig(level=logging.INFO, format="app %(name)s %(levelname)s %(message)s")
options = {"_wiring": Wiring(log_to_stderr=False)} if sys.argv[2] == "off" else {}
run = Run(sys.argv[1], every=1, **options)
run.save(1, b"state")
run = Run(sys.argv[1], **options)
run.restore()
"""


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("none", ["slurm-preempt: resuming from step 1 (attempt 1) on 1 node(s)"]),
        ("basicConfig", ["app slurm_preempt.job.resume INFO resuming from step 1 (attempt 1) on 1 node(s)"]),
        ("off", []),
    ],
)
def test_the_job_log_shows_key_lines_once_whoever_configured_logging(tmp_path, job, setup, expected):
    """A script that configured nothing gets `slurm-preempt: ...` on stderr; one that configured logging
    gets the line through its own handler, not twice; Wiring(log_to_stderr=False) prints nothing."""
    script = tmp_path / "job.py"
    script.write_text(LOG_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), setup],
        env={**os.environ, **job},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == expected


def test_close_says_the_work_is_done_unless_it_stopped_for_a_notice(tmp_path, job):
    """A notice can land between a program's last step and its exit: Run.close() tells the job script
    (through SLURM_PREEMPT_DONE_FILE) that the work is done, so the finished job is not requeued."""
    done = tmp_path / "ckpt" / ".done-123-1"
    environ = {**job, "SLURM_PREEMPT_DONE_FILE": str(done)}
    run = _run(tmp_path, environ, every=5)
    run.save(5, {"x": 1})
    run.close()
    assert done.exists()

    done.unlink()
    with pytest.raises(RuntimeError), _run(tmp_path, environ, every=5):
        raise RuntimeError("the loop crashed")  # a crash is not a finished job
    assert not done.exists()

    stopped = _run(tmp_path, environ, every=5)
    _notice(environ)
    assert stopped.should_checkpoint(6)
    stopped.save(6, {"x": 2})
    assert stopped.preempted
    stopped.close()  # stopped for the notice: the script must requeue it
    assert not done.exists()


# ------------------------------------------------------------------------------ the job author's surface


def test_the_docs_list_the_whole_surface_of_run():
    """docs/resume.md's list is Run's public surface, no more and no less (constructor parameters,
    methods, properties); everything else is internal (a leading underscore)."""
    listed = documented("The whole of `Run`")
    have = actual(Run)
    assert listed["constructor"] == have["constructor"]
    assert sorted(listed["methods"]) == have["methods"]
    assert sorted(listed["read-only properties"]) == have["read-only properties"]


def test_run_has_no_public_mutable_state(tmp_path, job):
    with _run(tmp_path, job, every=5) as run:
        assert [name for name in vars(run) if not name.startswith("_")] == []
        for name in actual(Run)["read-only properties"]:
            assert getattr(Run, name).fset is None, name
        with pytest.raises(AttributeError):
            run.step = 3  # type: ignore[misc]


def test_the_wiring_environment_is_the_whole_environment(tmp_path, job, monkeypatch):
    """Settings, the state folder and the checkpoint folder's owner record come from the environment a
    Run is given, not from the process's (whose configuration says keep = 5 here)."""
    (tmp_path / "process.toml").write_text("[resume]\nkeep = 5\n")
    monkeypatch.setenv("SLURM_PREEMPT_CONFIG", str(tmp_path / "process.toml"))
    (tmp_path / "config.toml").write_text("[resume]\nkeep = 1\nnotice_poll = 0\n")
    with _run(tmp_path, {**job, "SLURM_RESTART_COUNT": "4"}, every=1) as run:
        for step in (1, 2, 3):
            run.should_checkpoint(step)
            run.save(step, step)
        assert run._store.owner.job_id == "123" and run._store.owner.restart_count == 4
        run._store.settle()  # the pruning too
    assert CheckpointStore(tmp_path / "ckpt").steps() == [3]  # keep = 1, from the given environment
    assert [e["step"] for e in _kinds(job, "checkpoint_saved")] == [1, 2, 3]


def test_the_package_exports_the_job_authors_names_and_nothing_internal():
    import slurm_preempt

    assert sorted(slurm_preempt.__all__) == sorted(slurm_preempt._LAZY)
    assert "Slurm" not in slurm_preempt.__all__
    assert {"Run", "PickleFormat", "TorchFormat", "ShardedFormat", "CheckpointError"} <= set(
        slurm_preempt.__all__
    )
    assert issubclass(slurm_preempt.CheckpointError, slurm_preempt.SlurmPreemptError)
    with pytest.raises(AttributeError):
        slurm_preempt.Slurm  # noqa: B018


def test_a_checkpoint_longer_than_half_the_notices_warning_is_said_at_the_notice(tmp_path, job, capfd):
    with _run(tmp_path, job, every=100) as run:
        run.save(1, {"step": 1})
        run._save_seconds = 40.0  # as a slow store would measure it (manifest "seconds")
        _notice(job, grace=60)
        assert run.should_checkpoint(2)
        run.save(2, {"step": 2})
    err = capfd.readouterr().err
    assert "one checkpoint takes 40s, more than half the 60s a notice from test gives" in err, err


def test_a_checkpoint_well_inside_the_warning_is_not_warned_of(tmp_path, job, capfd):
    with _run(tmp_path, job, every=100) as run:
        run.save(1, {"step": 1})
        assert run._save_seconds is not None and run._save_seconds < 30  # measured from the manifest
        _notice(job, grace=60)
        assert run.should_checkpoint(2)
    assert "more than half" not in capfd.readouterr().err
