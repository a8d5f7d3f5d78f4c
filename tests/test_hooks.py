"""hooks install/check and the shell hooks run directly (no Slurm needed: a fake job environment)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_preempt import ledger
from slurm_preempt.cli import main
from slurm_preempt.records import hooks

DATA = Path(__file__).parent / "data"
# Every release with captured hook environments (scripts/capture-slurm-data.py).
RELEASES = sorted(p.parent.name.removeprefix("slurm-") for p in DATA.glob("slurm-*/hook-env"))
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="hooks install root-owned files")
each_release = pytest.mark.parametrize("release", RELEASES)


def _env(name: str, release: str = "22.05") -> dict[str, str]:
    """A real environment captured from Slurm (tests/data/slurm-<release>/hook-env/)."""
    text = (DATA / f"slurm-{release}" / "hook-env" / f"{name}.env").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_every_supported_release_has_captured_data():
    assert RELEASES == ["22.05", "24.11", "26.05"]


@pytest.fixture
def installed(tmp_path):
    prefix, state = tmp_path / "etc", tmp_path / "state"
    hooks.install(prefix, state)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n" + "\n".join(hooks.conf_lines(prefix)) + "\n")
    return prefix, state, conf


def _run(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(path)], env=env, capture_output=True, text=True, check=False)


@root_only
def test_install_prints_lines_and_dry_run_changes_nothing(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["hooks", "install", "--prefix", str(tmp_path / "p"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"Prolog={tmp_path}/p/prolog.d/*" in result.output
    assert "PrologFlags=Alloc" in result.output and "TaskProlog=" in result.output
    assert not (tmp_path / "p").exists()


@root_only
@each_release
def test_real_prolog_environment_records_attempt_start(installed, release):
    prefix, state, _conf = installed
    done = _run(prefix / "prolog.d" / hooks.HOOK_NAME, _env("prolog_slurmd", release))
    assert (done.returncode, done.stdout) == (0, "")
    job = _env("prolog_slurmd", release)["SLURM_JOB_ID"]
    [event] = ledger.events(state, job)
    assert event["kind"] == "attempt_start" and event["_trusted"]
    assert (event["node"], event["nodes"], event["restart_count"]) == ("pre1", "pre1", 0)
    assert (event["partition"], event["constraints"], event["user"]) == ("batch", "preemptible", "root")


@root_only
@each_release
def test_real_epilog_environments_record_attempt_end(installed, release):
    prefix, state, _conf = installed
    env = _env("epilog_slurmctld_failed", release)
    subprocess.run(["mkdir", "-p", str(state / "jobs" / env["SLURM_JOB_ID"])], check=True)
    assert _run(prefix / "slurm-preempt" / "epilog-slurmctld", env).returncode == 0
    assert _run(prefix / "epilog.d" / hooks.HOOK_NAME, _env("epilog_slurmd", release)).returncode == 0
    ends = ledger.events(state, env["SLURM_JOB_ID"])
    assert sorted(e["hook"] for e in ends) == ["epilog", "epilog_slurmctld"]
    assert {e["exit_code"] for e in ends} == {"3:0"}


@root_only
@each_release
def test_taskprolog_prints_exports(installed, release):
    prefix, state, _conf = installed
    done = _run(prefix / "slurm-preempt" / "taskprolog", _env("task_prolog", release))
    job = _env("task_prolog", release)["SLURM_JOB_ID"]
    assert done.stdout.splitlines() == [
        f"export SLURM_PREEMPT_STATE_DIR={state}",
        f"export SLURM_PREEMPT_NOTICE={state}/notices/{job}.json",
    ]


@root_only
def test_check_passes_on_a_good_installation(installed):
    prefix, _state, conf = installed
    findings = hooks.check(prefix, conf)
    assert all(f.ok for f in findings), [f.message for f in findings if not f.ok]
    assert any("dry run wrote" in f.message for f in findings)


@root_only
def test_check_catches_non_executable_file_in_glob_folder(installed):
    prefix, _state, conf = installed
    (prefix / "prolog.d" / "README").write_text("notes\n")
    result = CliRunner().invoke(main, ["hooks", "check", "--prefix", str(prefix), "--conf", str(conf)])
    assert result.exit_code == 1
    assert f"FAIL {prefix}/prolog.d/README is not an executable file" in result.output
    assert "drains the node" in result.output


@root_only
def test_check_catches_missing_taskprolog_line(installed):
    prefix, _state, conf = installed
    conf.write_text("\n".join(x for x in conf.read_text().splitlines() if not x.startswith("TaskProlog")))
    result = CliRunner().invoke(
        main, ["hooks", "check", "--prefix", str(prefix), "--conf", str(conf), "--json"]
    )
    assert result.exit_code == 1
    bad = [f["message"] for f in json.loads(result.output)["findings"] if not f["ok"]]
    assert bad == [f"{conf} has no TaskProlog line: add `TaskProlog={prefix}/slurm-preempt/taskprolog`"]


@root_only
def test_check_catches_empty_folder_and_writable_hook(installed):
    prefix, _state, conf = installed
    (prefix / "epilog.d" / hooks.HOOK_NAME).unlink()
    os.chmod(prefix / "prolog.d" / hooks.HOOK_NAME, 0o777)
    bad = [f.message for f in hooks.check(prefix, conf, dry_run=False) if not f.ok]
    assert any("epilog.d is empty" in m for m in bad)
    assert any("writable by group or others" in m for m in bad)


@root_only
def test_edit_conf_replaces_our_keys_and_keeps_a_backup(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nProlog=/old/prolog\nPrologFlags=Contain\n")
    result = hooks.install(tmp_path / "p", tmp_path / "s", edit_conf=conf)
    text = conf.read_text()
    assert "#Prolog=/old/prolog" in text and f"Prolog={tmp_path}/p/prolog.d/*" in text
    assert Path(result.conf_edited).read_text().startswith("ClusterName=x\nProlog=/old/prolog")
    assert all(f.ok for f in hooks.check_conf(conf, tmp_path / "p"))


def test_install_refuses_a_relative_state_dir(tmp_path):
    result = CliRunner().invoke(
        main, ["hooks", "install", "--prefix", str(tmp_path), "--state-dir", "a b", "--dry-run"]
    )
    assert result.exit_code == 2 and "absolute path" in result.output


def _user(name: str) -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True)
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid


@root_only
def test_non_root_slurm_user_can_record_ends_and_is_trusted():
    """Debian runs slurmctld (and so EpilogSlurmctld) as `slurm`: its events must land and be believed."""
    import shutil
    import tempfile

    slurm_uid, slurm_gid = _user("slurm")
    job_uid, job_gid = _user("sphooks")
    base = Path(tempfile.mkdtemp(prefix="sp-hooks-slurmuser-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        prefix, state = base / "etc", base / "state"
        hooks.install(prefix, state, slurm_user="slurm")
        jobs = state / "jobs"
        assert (jobs.stat().st_gid, oct(jobs.stat().st_mode & 0o777)) == (slurm_gid, "0o775")
        env = {**_env("prolog_slurmd"), "SLURM_JOB_UID": str(job_uid), "SLURM_JOB_GID": str(job_gid)}
        assert _run(prefix / "prolog.d" / hooks.HOOK_NAME, env).returncode == 0
        folder = jobs / env["SLURM_JOB_ID"]
        info = folder.stat()
        assert (info.st_uid, info.st_gid, oct(info.st_mode & 0o777)) == (job_uid, slurm_gid, "0o770")
        ctld_env = {**_env("epilog_slurmctld_node_fail"), "SLURM_JOB_UID": str(job_uid)}
        ctld = [f"{k}={v}" for k, v in ctld_env.items()]
        hook = prefix / "slurm-preempt" / "epilog-slurmctld"
        done = subprocess.run(["runuser", "-u", "slurm", "--", "env", "-i", *ctld, str(hook)], check=False)
        assert done.returncode == 0
        trusted = ledger.trusted_events(state, env["SLURM_JOB_ID"])
        assert sorted((e["kind"], e["_uid"]) for e in trusted) == [
            ("attempt_end", slurm_uid),
            ("attempt_start", 0),
        ]
        assert all(f.ok for f in hooks.check(prefix, _write_conf(base, prefix), dry_run=False))
    finally:
        shutil.rmtree(base)


def _write_conf(base: Path, prefix: Path) -> Path:
    conf = base / "slurm.conf"
    conf.write_text("\n".join(hooks.conf_lines(prefix)) + "\n")
    return conf
