"""Install and check the prolog/epilog hooks that write the restart ledger.

Installed layout under ``prefix`` (default ``/etc/slurm``)::

    prolog.d/50-slurm-preempt          Prolog=<prefix>/prolog.d/*   (node, root, attempt_start)
    epilog.d/50-slurm-preempt          Epilog=<prefix>/epilog.d/*   (node, root, node-side attempt_end)
    slurm-preempt/epilog-slurmctld     EpilogSlurmctld=...          (controller, attempt_end)
    slurm-preempt/taskprolog           TaskProlog=...               (user, exports notice/state paths)
    slurm-preempt/lib.sh               shared shell functions (sourced, root-owned)
    slurm-preempt/hooks.conf           state_dir=..., log=...       (parsed, never executed)

The hooks are POSIX sh, not Python: they run at every job start and end and must cost milliseconds.
EpilogSlurmctld writes the authoritative end of an attempt because the node epilog never runs on a
node that vanished; PrologSlurmctld is not used since the node prolog already sees the node name and
restart count at allocation, and adding a controller-side script would only add a fork per job there.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from slurm_preempt.config import DEFAULT_STATE_DIR
from slurm_preempt.durable import open_dir, write_atomic
from slurm_preempt.errors import UsageError
from slurm_preempt.resources import data_path
from slurm_preempt.trust import WRITERS

DEFAULT_PREFIX = Path("/etc/slurm")
HOOK_NAME = "50-slurm-preempt"
OWN_DIR = "slurm-preempt"
SHIPPED = "etc/slurm"  # the shipped tree (resources.data_path), laid out as under the prefix
# path under the prefix (and under SHIPPED) -> mode. lib.sh first: the hooks source it.
FILES = {
    f"{OWN_DIR}/lib.sh": 0o644,
    f"{OWN_DIR}/epilog-slurmctld": 0o755,
    f"{OWN_DIR}/taskprolog": 0o755,
    f"prolog.d/{HOOK_NAME}": 0o755,
    f"epilog.d/{HOOK_NAME}": 0o755,
}
CONF_KEYS = ("Prolog", "Epilog", "PrologFlags", "TaskProlog", "EpilogSlurmctld")


def conf_lines(prefix: Path) -> list[str]:
    """The slurm.conf lines an installation under ``prefix`` needs."""
    return [
        f"Prolog={prefix}/prolog.d/*",
        f"Epilog={prefix}/epilog.d/*",
        "PrologFlags=Alloc",
        f"TaskProlog={prefix}/{OWN_DIR}/taskprolog",
        f"EpilogSlurmctld={prefix}/{OWN_DIR}/epilog-slurmctld",
    ]


def hooks_conf_text(state_dir: Path, log: str = "", slurm_gid: int | None = None) -> str:
    if "\n" in str(state_dir) or " " in str(state_dir) or not Path(state_dir).is_absolute():
        raise UsageError(f"--state-dir must be an absolute path without spaces: {state_dir}")
    return (
        "# slurm-preempt hooks configuration (root-owned; parsed, never executed).\n"
        f"state_dir={state_dir}\nlog={log}\n" + (f"slurm_gid={slurm_gid}\n" if slurm_gid is not None else "")
    )


def _slurm_ids(slurm_user: str) -> tuple[int, int] | None:
    """(uid, gid) of a non-root SlurmUser, None for root."""
    if slurm_user in ("", "root"):
        return None
    try:
        entry = pwd.getpwnam(slurm_user)
    except KeyError:
        raise UsageError(f"--slurm-user {slurm_user}: no such user on this machine") from None
    return (entry.pw_uid, entry.pw_gid) if entry.pw_uid != 0 else None


@dataclass
class InstallResult:
    prefix: Path
    state_dir: Path
    actions: list[str] = field(default_factory=list)
    conf_lines: list[str] = field(default_factory=list)
    conf_edited: str = ""

    def to_json(self) -> dict:
        return {
            "prefix": str(self.prefix),
            "state_dir": str(self.state_dir),
            "actions": self.actions,
            "conf_lines": self.conf_lines,
            "conf_edited": self.conf_edited,
        }


def install(
    prefix: Path = DEFAULT_PREFIX,
    state_dir: Path = DEFAULT_STATE_DIR,
    dry_run: bool = False,
    edit_conf: Path | None = None,
    log: str = "",
    slurm_user: str = "root",
) -> InstallResult:
    """Copy the hooks under ``prefix``, write hooks.conf, create the state folder (root, 0755).

    With a non-root ``slurm_user`` (slurm.conf's SlurmUser, as which EpilogSlurmctld runs), ``jobs/``
    becomes group SlurmUser's and writable by it with the sticky bit, and ``<state>/writers`` names it
    as trusted.
    """
    prefix, state_dir = Path(prefix).absolute(), Path(state_dir).absolute()
    ids = _slurm_ids(slurm_user)
    conf_text = hooks_conf_text(state_dir, log, ids[1] if ids else None)
    result = InstallResult(prefix, state_dir, conf_lines=conf_lines(prefix))
    for target, mode in FILES.items():
        source = data_path(f"{SHIPPED}/{target}")
        if not source.is_file():
            raise UsageError(f"shipped hook {source} is missing: the installation of slurm-preempt is broken")
        result.actions.append(f"install {source} -> {prefix / target} (mode {mode:o})")
        if not dry_run:
            _copy(source, prefix / target, mode)
    result.actions.append(f"write {prefix / OWN_DIR / 'hooks.conf'} (state_dir={state_dir})")
    for sub in ("", "jobs", "notices"):
        result.actions.append(f"create folder {state_dir / sub} (root, mode 755)")
    if ids is not None:
        result.actions.append(
            f"give {state_dir / 'jobs'} to group {ids[1]} (mode 1775, sticky) for SlurmUser {slurm_user}"
        )
    result.actions.append(f"write {state_dir / WRITERS} (uids whose events are trusted)")
    if dry_run:
        return result
    _write(prefix / OWN_DIR / "hooks.conf", conf_text, 0o644)
    for sub in ("", "jobs", "notices"):
        group = ids[1] if ids is not None and sub == "jobs" else 0
        # Sticky: a member of SlurmUser's group may add files, never rename or delete another's folder.
        _own_folder(state_dir / sub, 0o1775 if group else 0o755, group)
    writers = "0\n" + (f"{ids[0]}\n" if ids is not None else "")
    _write(state_dir / WRITERS, writers, 0o644)
    if edit_conf is not None:
        result.conf_edited = str(edit_slurm_conf(Path(edit_conf), result.conf_lines))
    return result


def _own_folder(folder: Path, mode: int, group: int) -> None:
    """Create ``folder`` (root's, ``mode``, group ``group``) through descriptors: every folder above it
    must be root's and closed to others (``durable.open_dir``), so no user can swap a symlink in while
    root sets its owner and mode (finding 5: a planted link once had its target chowned)."""
    try:
        fd = open_dir(folder, create=0o755)
    except PermissionError as exc:
        raise UsageError(f"{folder}: {exc.strerror}; choose a state folder only root can change") from None
    try:
        os.fchown(fd, 0, group)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _copy(source: Path, target: Path, mode: int) -> None:
    _write(target, source.read_text(), mode)


def _write(target: Path, text: str, mode: int) -> None:
    """The new file replaces (never writes through) whatever was at ``target``, in a folder reached
    only through root's folders. Its temporary name starts with a dot, which Slurm's ``prolog.d/*``
    glob does not match."""
    try:
        os.close(open_dir(target.parent, create=0o755))
        write_atomic(target, text, mode, trusted=True)
    except PermissionError as exc:
        raise UsageError(
            f"{target}: {exc.strerror}; install only where root alone can change things"
        ) from None


def edit_slurm_conf(path: Path, lines: list[str]) -> Path:
    """Comment out the keys we set and append our lines; keep a backup next to it. Returns the backup."""
    try:
        old = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    backup = path.with_name(path.name + ".before-slurm-preempt")
    shutil.copy2(path, backup)
    keys = {k.lower() for k in CONF_KEYS}
    kept = [
        f"#{line}  # replaced by slurm-preempt" if _conf_key(line) in keys else line
        for line in old.splitlines()
    ]
    _write(
        path, "\n".join([*kept, "# slurm-preempt hooks", *lines]) + "\n", stat.S_IMODE(path.stat().st_mode)
    )
    return backup


def _conf_key(line: str) -> str:
    text = line.strip()
    if text.startswith("#") or "=" not in text:
        return ""
    return text.split("=", 1)[0].strip().lower()


# ---------------------------------------------------------------------------------------- check


@dataclass(frozen=True)
class Finding:
    ok: bool
    message: str
    note: bool = False  # neither right nor wrong: something an admin should know

    def to_json(self) -> dict:
        return {"ok": self.ok, "message": self.message, **({"note": True} if self.note else {})}


def check(prefix: Path = DEFAULT_PREFIX, conf: Path | None = None, dry_run: bool = True) -> list[Finding]:
    """Verify an installation; every finding says in plain words what is right or wrong."""
    prefix = Path(prefix).absolute()
    found: list[Finding] = []
    for glob in ("prolog.d", "epilog.d"):
        found += _check_glob_folder(prefix / glob)
    for target, mode in FILES.items():
        found += _check_file(prefix / target, executable=bool(mode & 0o100))
    hooks_conf = prefix / OWN_DIR / "hooks.conf"
    found += _check_file(hooks_conf, executable=False)
    settings = read_hooks_conf(hooks_conf)
    state_dir = settings.get("state_dir", str(DEFAULT_STATE_DIR))
    slurm_gid = int(settings["slurm_gid"]) if settings.get("slurm_gid", "").isdigit() else None
    found.append(_check_state_folder(Path(state_dir)))
    found.append(_check_state_folder(Path(state_dir) / "jobs", slurm_gid))
    found += check_conf(conf or _default_conf(), prefix)
    nothing_missing = not any("is missing" in f.message for f in found if not f.ok)
    if dry_run and nothing_missing:  # a dry run of an incomplete installation would only repeat that
        found += dry_run_hooks(prefix)
    return found


def _default_conf() -> Path:
    return Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))


def read_hooks_conf(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _unsafe_mode(info: os.stat_result, group_ok: int | None = None) -> str:
    if info.st_uid != 0:
        return f"is owned by uid {info.st_uid}, not root"
    others = 0o002 if group_ok is not None and info.st_gid == group_ok else 0o022
    if info.st_mode & others:
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    if info.st_mode & 0o020 and not info.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(info.st_mode)
        return f"is writable by its group without the sticky bit (mode {mode:o}: run `hooks install` again)"
    return ""


def _check_glob_folder(folder: Path) -> list[Finding]:
    if not folder.is_dir():
        return [Finding(False, f"{folder} is missing: Slurm fails every job whose glob matches nothing")]
    names = sorted(os.listdir(folder))
    if not names:
        return [Finding(False, f"{folder} is empty: an empty glob fails every job and drains the node")]
    out = []
    for name in names:
        path = folder / name
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
            out.append(
                Finding(
                    False,
                    f"{path} is not an executable file: Slurm runs every file in {folder.name}/, "
                    "so it fails every job and drains the node; remove it or chmod +x it",
                )
            )
    return out or [Finding(True, f"{folder}: {len(names)} executable hook(s)")]


def _check_file(path: Path, executable: bool) -> list[Finding]:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return [Finding(False, f"{path} is missing: run `slurm-preempt hooks install`")]
    problems = []
    if not stat.S_ISREG(info.st_mode):
        problems.append(f"{path} is not a regular file")
    if executable and not info.st_mode & 0o111:
        problems.append(f"{path} is not executable (chmod 755 it)")
    unsafe = _unsafe_mode(info)
    if unsafe:
        problems.append(f"{path} {unsafe}: a user who can change it runs code as root")
    return [Finding(False, p) for p in problems] or [Finding(True, f"{path} ok")]


def _check_state_folder(folder: Path, group_ok: int | None = None) -> Finding:
    try:
        info = folder.lstat()
    except FileNotFoundError:
        return Finding(
            False, f"state folder {folder} is missing: hooks record nothing (create it, root, 755)"
        )
    if not stat.S_ISDIR(info.st_mode):
        return Finding(False, f"state folder {folder} is not a folder (a symlink?): hooks record nothing")
    unsafe = _unsafe_mode(info, group_ok)
    if unsafe:
        return Finding(False, f"state folder {folder} {unsafe}: hooks refuse it and record nothing")
    return Finding(True, f"state folder {folder} ok")


def check_conf(conf: Path, prefix: Path) -> list[Finding]:
    """Are our lines in slurm.conf (last value of each key wins, as in Slurm)?"""
    try:
        text = conf.read_text()
    except OSError as exc:
        return [Finding(False, f"cannot read slurm.conf {conf}: {exc.strerror}")]
    values: dict[str, str] = {}
    for line in text.splitlines():
        key = _conf_key(line)
        if key:
            values[key] = line.split("=", 1)[1].split("#", 1)[0].strip()
    out = []
    for wanted in conf_lines(prefix):
        key, value = wanted.split("=", 1)
        have = values.get(key.lower())
        if key == "PrologFlags":
            flags = {f.strip().lower() for f in (have or "").split(",")}
            ok = "alloc" in flags
        else:
            ok = have == value
        if ok:
            out.append(Finding(True, f"{conf}: {key} ok"))
        elif have is None:
            out.append(Finding(False, f"{conf} has no {key} line: add `{wanted}`"))
        else:
            out.append(Finding(False, f"{conf} says {key}={have}: it should be `{wanted}`"))
    return out


FAKE_JOB = {
    "SLURM_JOB_ID": "4294967290",
    "SLURM_JOB_USER": "nobody",
    "SLURM_JOB_UID": "0",
    "SLURM_JOB_GID": "0",
    "SLURM_JOB_RESTART_COUNT": "0",
    "SLURM_JOB_PARTITION": "check",
    "SLURM_JOB_CONSTRAINTS": "preemptible",
    "SLURM_NODELIST": "check1",
    "SLURMD_NODENAME": "check1",
    "SLURM_JOB_EXIT_CODE2": "0:0",
    "SLURM_JOB_DERIVED_EC": "0",
}


def dry_run_hooks(prefix: Path, timeout: float = 10.0) -> list[Finding]:
    """Run copies of the installed hooks against a scratch state folder with a fake job environment."""
    out = []
    with tempfile.TemporaryDirectory(prefix="sp-hooks-check-") as scratch:
        root = Path(scratch)
        for sub in ("prolog.d", "epilog.d", OWN_DIR):
            if (prefix / sub).is_dir():
                shutil.copytree(prefix / sub, root / sub)
        state = root / "state"
        (state / "jobs").mkdir(parents=True)
        _write(root / OWN_DIR / "hooks.conf", hooks_conf_text(state), 0o644)
        env = dict(FAKE_JOB)  # no PATH, as slurmd gives it
        for rel in (
            f"prolog.d/{HOOK_NAME}",
            f"{OWN_DIR}/taskprolog",
            f"epilog.d/{HOOK_NAME}",
            f"{OWN_DIR}/epilog-slurmctld",
        ):
            out.append(_run_one(root / rel, env, timeout))
        written = sorted(
            p.name.split("-")[-1] for p in (state / "jobs" / FAKE_JOB["SLURM_JOB_ID"]).glob("*.json")
        )
        want = ["attempt_end.json", "attempt_end.json", "attempt_start.json"]
        if written == want:
            out.append(Finding(True, "dry run wrote attempt_start and attempt_end events"))
        else:
            out.append(Finding(False, f"dry run wrote {written or 'no events'}, expected {want}"))
    return out


def _run_one(path: Path, env: dict[str, str], timeout: float) -> Finding:
    if not path.exists():
        return Finding(False, f"dry run: {path.name} is missing")
    try:
        done = subprocess.run(
            [str(path)], env=env, cwd="/", capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding(False, f"dry run: {path.name} could not run ({exc})")
    if done.returncode != 0:
        return Finding(False, f"dry run: {path.name} exited {done.returncode}: Slurm would drain the node")
    return Finding(True, f"dry run: {path.name} exited 0")
