"""hooks install/check and the shell hooks run directly (no Slurm needed: a fake job environment)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from hostileusers import MALLORY, ensure_user
from slurm_preempt import ledger
from slurm_preempt.admin import hooks
from slurm_preempt.cli import main

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
    assert RELEASES == ["22.05", "24.11", "25.11", "26.05"]


@pytest.fixture
def installed(tmp_path):
    prefix, state = tmp_path / "etc", tmp_path / "state"
    hooks.install(prefix, state)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n" + "\n".join(hooks.conf_lines(prefix)) + "\n")
    return prefix, state, conf


def _run(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(path)], env=env, capture_output=True, text=True, check=False)


REPO = Path(__file__).resolve().parent.parent
# What `hooks install PREFIX --state-dir STATE` lays down, as captured before the hook scripts moved from
# etc/slurm/ to prolog.d/ and epilog.d/ at the top of the repository (commit 945a8f3): path -> mode and
# the repository file it copies (None: a folder, or a file install writes itself). All root's.
INSTALLED_TREE = {
    "etc": (0o755, None),
    "etc/epilog.d": (0o755, None),
    f"etc/epilog.d/{hooks.HOOK_NAME}": (0o755, f"epilog.d/{hooks.HOOK_NAME}"),
    "etc/prolog.d": (0o755, None),
    f"etc/prolog.d/{hooks.HOOK_NAME}": (0o755, f"prolog.d/{hooks.HOOK_NAME}"),
    "etc/slurm-preempt": (0o755, None),
    "etc/slurm-preempt/epilog-slurmctld": (0o755, "etc/slurm/slurm-preempt/epilog-slurmctld"),
    "etc/slurm-preempt/hooks.conf": (0o644, None),
    "etc/slurm-preempt/lib.sh": (0o644, "etc/slurm/slurm-preempt/lib.sh"),
    "etc/slurm-preempt/taskprolog": (0o755, "etc/slurm/slurm-preempt/taskprolog"),
    "state": (0o755, None),
    "state/jobs": (0o755, None),
    "state/notices": (0o755, None),
    "state/writers": (0o644, None),
}


@root_only
def test_install_lays_down_the_same_tree_as_before_the_hooks_moved(tmp_path):
    hooks.install(tmp_path / "etc", tmp_path / "state")
    found = {}
    for path in sorted(tmp_path.rglob("*")):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (0, 0), path
        found[str(path.relative_to(tmp_path))] = stat.S_IMODE(info.st_mode)
    assert found == {name: mode for name, (mode, _source) in INSTALLED_TREE.items()}
    for name, (_mode, source) in INSTALLED_TREE.items():
        if source is not None:
            assert (tmp_path / name).read_bytes() == (REPO / source).read_bytes(), name
    conf = (tmp_path / "etc/slurm-preempt/hooks.conf").read_text()
    assert conf == (
        "# slurm-preempt hooks configuration (root-owned; parsed, never executed).\n"
        f"state_dir={tmp_path / 'state'}\nlog=\n"
    )
    assert (tmp_path / "state/writers").read_text() == "0\n"


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
        assert (jobs.stat().st_gid, oct(jobs.stat().st_mode & 0o7777)) == (slurm_gid, "0o1775")
        env = {**_env("prolog_slurmd"), "SLURM_JOB_UID": str(job_uid), "SLURM_JOB_GID": str(job_gid)}
        assert _run(prefix / "prolog.d" / hooks.HOOK_NAME, env).returncode == 0
        folder = jobs / env["SLURM_JOB_ID"]
        info = folder.stat()
        assert (info.st_uid, info.st_gid, oct(info.st_mode & 0o7777)) == (job_uid, slurm_gid, "0o1770")
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


# ---------------------------------------------------------------------------------------- hostile


HOOKS = (f"prolog.d/{hooks.HOOK_NAME}", f"epilog.d/{hooks.HOOK_NAME}", "slurm-preempt/epilog-slurmctld",
         "slurm-preempt/taskprolog")  # fmt: skip
SHELLS = ("dash", "bash")


def _break_lib_missing(prefix, state, env):
    (prefix / "slurm-preempt" / "lib.sh").unlink()


def _break_lib_a_folder(prefix, state, env):
    lib = prefix / "slurm-preempt" / "lib.sh"
    lib.unlink()
    lib.mkdir()


def _break_lib_syntax(prefix, state, env):
    (prefix / "slurm-preempt" / "lib.sh").write_text("sp_init() {\n  if then fi\n")


def _break_lib_unreadable(prefix, state, env):
    os.chmod(prefix / "slurm-preempt" / "lib.sh", 0)


def _break_conf_missing(prefix, state, env):
    (prefix / "slurm-preempt" / "hooks.conf").unlink()


def _break_conf_relative(prefix, state, env):
    (prefix / "slurm-preempt" / "hooks.conf").write_text("state_dir=relative/dir\nlog=\n")


def _break_state_missing(prefix, state, env):
    shutil.rmtree(state)


def _break_state_not_roots(prefix, state, env):
    os.chown(state, ensure_user(MALLORY)[0], -1)


def _break_state_world_writable(prefix, state, env):
    os.chmod(state, 0o777)


def _break_jobs_a_symlink(prefix, state, env):
    elsewhere = state.parent / "elsewhere"
    elsewhere.mkdir()
    os.rmdir(state / "jobs")
    os.symlink(elsewhere, state / "jobs")


def _break_jobs_a_file(prefix, state, env):
    os.rmdir(state / "jobs")
    (state / "jobs").write_text("")


def _break_job_dir_a_symlink(prefix, state, env):
    elsewhere = state.parent / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, state / "jobs" / env["SLURM_JOB_ID"])


def _break_job_id(prefix, state, env):
    env["SLURM_JOB_ID"] = "../../elsewhere"


def _break_job_id_command(prefix, state, env):
    env["SLURM_JOB_ID"] = "1;touch ${HOME:-/tmp}/owned"
    env["SLURM_JOB_UID"] = "0;x"


def _break_hostile_values(prefix, state, env):
    for key in ("SLURMD_NODENAME", "SLURM_JOB_USER", "SLURM_JOB_PARTITION", "SLURM_JOB_CONSTRAINTS"):
        env[key] = '"},{"kind":"attempt_end"\n\\\x01' + "x" * 100_000


def _break_no_environment(prefix, state, env):
    env.clear()


FAILURES = {
    "lib.sh missing": _break_lib_missing,
    "lib.sh a folder": _break_lib_a_folder,
    "lib.sh syntax error": _break_lib_syntax,
    "lib.sh mode 000": _break_lib_unreadable,
    "hooks.conf missing": _break_conf_missing,
    "hooks.conf relative state_dir": _break_conf_relative,
    "state folder missing": _break_state_missing,
    "state folder another user's": _break_state_not_roots,
    "state folder world-writable": _break_state_world_writable,
    "jobs/ a symlink": _break_jobs_a_symlink,
    "jobs/ a file": _break_jobs_a_file,
    "job folder a planted symlink": _break_job_dir_a_symlink,
    "job id a path": _break_job_id,
    "job id and uid with shell": _break_job_id_command,
    "hostile values, 100 kB each": _break_hostile_values,
    "no environment at all": _break_no_environment,
}


@root_only
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_every_hook_exits_0_on_every_failure_in_dash_and_bash(tmp_path, shell, failure):
    """Finding 4: under dash, `. lib.sh || exit 0` exited 2 when lib.sh was missing or unreadable (a
    failing prolog drains the node). 16 failures x 4 hooks x 2 shells; nothing lands outside jobs/."""
    prefix, state = tmp_path / "etc", tmp_path / "state"
    hooks.install(prefix, state)
    env = {**_env("prolog_slurmd"), "PATH": "/nonexistent"}
    FAILURES[failure](prefix, state, env)
    for hook in HOOKS:
        argv = [shutil.which(shell) or shell, str(prefix / hook)]
        done = subprocess.run(argv, env=env, capture_output=True, check=False)
        assert done.returncode == 0, (hook, done.stderr[-300:])
    elsewhere = tmp_path / "elsewhere"
    assert not elsewhere.exists() or os.listdir(elsewhere) == []
    assert not (tmp_path / "owned").exists() and not Path("/tmp/owned").exists()


def test_install_writes_lib_sh_before_the_hooks_that_source_it(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(hooks, "_copy", lambda source, target, mode: order.append(target.name))
    monkeypatch.setattr(hooks, "_write", lambda *a: None)
    monkeypatch.setattr(hooks, "_own_folder", lambda *a: None)
    hooks.install(tmp_path / "etc", tmp_path / "state")
    assert order[0] == "lib.sh" and len(order) == len(hooks.FILES)


@root_only
@pytest.mark.parametrize("where", ["parent owned by a user", "parent world-writable, no sticky bit"])
def test_install_never_chowns_or_chmods_through_a_folder_a_user_controls(tmp_path, where):
    """Finding 5: a symlink planted where the state folder goes had its target chowned and chmodded.
    Now every folder on the way must be root's and closed (or sticky): install refuses, and the
    target of the planted link keeps its owner and mode."""
    uid, _gid = ensure_user(MALLORY)
    parent = tmp_path / "shared"
    parent.mkdir()
    if where.startswith("parent owned"):
        os.chown(parent, uid, -1)
    else:
        os.chmod(parent, 0o777)
    secret = tmp_path / "secret"
    secret.write_text("root's")
    os.chmod(secret, 0o600)
    os.symlink(secret, parent / "state")
    result = CliRunner().invoke(
        main, ["hooks", "install", "--prefix", str(tmp_path / "etc"), "--state-dir", str(parent / "state")]
    )
    assert result.exit_code == 2 and "refusing the folder" in result.output, result.output
    info = secret.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)


@root_only
def test_install_follows_an_admins_own_symlink(tmp_path):
    real = tmp_path / "real-etc"
    real.mkdir()
    os.symlink(real, tmp_path / "etc")
    hooks.install(tmp_path / "etc", tmp_path / "state")
    assert (real / "slurm-preempt" / "lib.sh").is_file()


# ---------------------------------------------------------------------------------------- issue 28


@root_only
def test_a_reused_job_id_gets_a_folder_of_its_own(installed):
    """Item 3: jobs/<id>/ of an earlier job of another user (Slurm reused the id) holds events she
    planted for the next job with that id; the prolog of the new job's first attempt moves it aside and
    gives the new job a fresh folder of its user's, so nothing of hers is read or believed for it."""
    prefix, state, _conf = installed
    mallory, _ = ensure_user(MALLORY)
    job_uid, job_gid = _user("sphooks")
    env = {**_env("prolog_slurmd"), "SLURM_JOB_UID": str(job_uid), "SLURM_JOB_GID": str(job_gid)}
    job = env["SLURM_JOB_ID"]
    old = ledger.job_dir(state, job)
    old.mkdir(mode=0o700)
    planted = old / "9-x-1-signal_sent.json"
    planted.write_text(
        json.dumps({"kind": "signal_sent", "job_id": job, "event_id": "pre1@2026-01-01T00:00:00Z"})
    )
    for path in (old, planted):
        os.chown(path, mallory, mallory)
    assert (
        _run(prefix / "prolog.d" / hooks.HOOK_NAME, {**env, "SLURM_JOB_RESTART_COUNT": "0"}).returncode == 0
    )
    info = old.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (job_uid, 0o700)
    assert [e["kind"] for e in ledger.events(state, job)] == ["attempt_start"]
    aside = [p for p in (state / "jobs").iterdir() if p.name.startswith(f".earlier-{job}-")]
    assert len(aside) == 1 and (aside[0] / planted.name).exists() and ledger.job_ids(state) == [job]
    assert ledger.find(state, job, "signal_sent", job_uid, event_id="pre1@2026-01-01T00:00:00Z") is None


@root_only
def test_a_later_attempt_and_a_sibling_node_keep_the_jobs_folder(installed):
    """Only restart count 0 moves anything, and only a folder of someone else (or root's, with an
    attempt already started): another node's prolog of the same allocation, or a requeued run, keep it."""
    prefix, state, _conf = installed
    job_uid, job_gid = _user("sphooks")
    env = {**_env("prolog_slurmd"), "SLURM_JOB_UID": str(job_uid), "SLURM_JOB_GID": str(job_gid)}
    job = env["SLURM_JOB_ID"]
    hook = prefix / "prolog.d" / hooks.HOOK_NAME
    ledger.record(state, job, "fallback", source="watcher")  # root's, before the job ever started
    assert stat.S_IMODE(ledger.job_dir(state, job).stat().st_mode) == 0o700
    for restart in ("0", "0", "1"):
        assert _run(hook, {**env, "SLURM_JOB_RESTART_COUNT": restart}).returncode == 0
    assert ledger.job_dir(state, job).stat().st_uid == job_uid  # root's folder handed over
    kinds = sorted(e["kind"] for e in ledger.events(state, job))
    assert kinds == ["attempt_start", "attempt_start", "attempt_start", "fallback"]
    assert not [p for p in (state / "jobs").iterdir() if p.name.startswith(".earlier-")]


@root_only
def test_a_member_of_slurmusers_group_cannot_move_other_jobs_folders(tmp_path):
    """Item 6: with a non-root SlurmUser, jobs/ is its group's to write; with the sticky bit a member of
    that group (here sp-mallory, given the group) can neither rename another job's folder (to race the
    epilog's move into it) nor delete it; a jobs/ without the sticky bit is refused by the hooks."""
    import shutil as _shutil
    import tempfile

    _slurm_uid, slurm_gid = _user("slurm")
    mallory, mallory_gid = ensure_user(MALLORY)
    job_uid, job_gid = _user("sphooks")
    base = Path(tempfile.mkdtemp(prefix="sp-hooks-group-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        prefix, state = base / "etc", base / "state"
        hooks.install(prefix, state, slurm_user="slurm")
        env = {**_env("prolog_slurmd"), "SLURM_JOB_UID": str(job_uid), "SLURM_JOB_GID": str(job_gid)}
        assert _run(prefix / "prolog.d" / hooks.HOOK_NAME, env).returncode == 0
        jobs, job = state / "jobs", env["SLURM_JOB_ID"]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: mallory, a member of SlurmUser's group
            os.close(read)
            outcome = b""
            try:
                os.setgroups([slurm_gid])
                os.setgid(mallory_gid)
                os.setuid(mallory)
                for act in (lambda: os.rename(jobs / job, jobs / "x"), lambda: os.rmdir(jobs / job)):
                    try:
                        act()
                        outcome += b"done "
                    except PermissionError:
                        outcome += b"refused "
                    except OSError:
                        outcome += b"other "
            finally:
                os.write(write, outcome)
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        assert os.read(read, 100).split() == [b"refused", b"refused"]
        os.close(read)
        os.chmod(jobs, 0o775)  # an install from before: group-writable, no sticky bit
        (state / "before").mkdir()
        env2 = {**env, "SLURM_JOB_ID": str(int(job) + 1)}
        assert _run(prefix / "prolog.d" / hooks.HOOK_NAME, env2).returncode == 0
        assert not ledger.job_dir(state, env2["SLURM_JOB_ID"]).exists()  # refused: nothing recorded
        assert any("sticky" in f.message for f in hooks.check(prefix, _write_conf(base, prefix)) if not f.ok)
    finally:
        _shutil.rmtree(base)


@root_only
def test_the_hooks_log_only_into_a_folder_closed_to_users(tmp_path):
    """Issue 28 item 7: `log=` is appended to by path; in a folder users may write (sticky or not) a
    user could swap a link in between the hook's -L check and its `>>`, so nothing is written there."""
    closed, shared = tmp_path / "closed", tmp_path / "shared"
    closed.mkdir(mode=0o755)
    shared.mkdir()
    shared.chmod(0o1777)
    for folder, written in ((closed, True), (shared, False)):
        prefix, state = tmp_path / f"etc-{folder.name}", tmp_path / f"state-{folder.name}"
        hooks.install(prefix, state, log=str(folder / "hooks.log"))
        env = {**_env("prolog_slurmd"), "SLURM_JOB_ID": "not-a-job"}
        assert _run(prefix / "prolog.d" / hooks.HOOK_NAME, env).returncode == 0
        assert (folder / "hooks.log").exists() is written
