"""One configuration search for every command.

Files are TOML, read in this order, later ones overriding earlier ones key by key:

1. ``/etc/slurm-preempt/config.toml``            site defaults (admins)
2. ``$XDG_CONFIG_HOME/slurm-preempt/config.toml`` the user's (``~/.config`` when unset)
3. ``$SLURM_PREEMPT_CONFIG``                      a file named in the environment (tests, one-offs)

Command-line options override all of them; each command does that itself.

The state folder (notices, ledger, watcher state) is ``$SLURM_PREEMPT_STATE_DIR``, else ``state_dir`` of
the files, else the site's ``/var/lib/slurm-preempt`` when it exists (admins installed slurm-preempt) or
for root, else the user's own ``$XDG_STATE_HOME/slurm-preempt`` (``~/.local/state``): a user's
``watch --user`` and the jobs ``slurm-preempt sbatch`` writes for them agree on it with no file at all.
``etc/slurm-preempt/config.toml.example`` documents every key.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_preempt.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SYSTEM_CONFIG = Path("/etc/slurm-preempt/config.toml")
ENV_CONFIG = "SLURM_PREEMPT_CONFIG"
ENV_STATE_DIR = "SLURM_PREEMPT_STATE_DIR"
DEFAULT_STATE_DIR = Path("/var/lib/slurm-preempt")


def user_state_dir(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """The user's own state folder, as the XDG base directory spec places state: ``$XDG_STATE_HOME``
    (absolute only), else ``$HOME/.local/state``, else the home of the password entry."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "slurm-preempt"
    home = env.get("HOME") or pwd.getpwuid(os.getuid() if uid is None else uid).pw_dir
    return Path(home) / ".local" / "state" / "slurm-preempt"


def default_state_dir(
    environ: Mapping[str, str] | None = None, uid: int | None = None, site: Path = DEFAULT_STATE_DIR
) -> Path:
    """The state folder when nothing names one: the site's when admins made it (or for root, whose
    daemon makes it), else the user's own. Existence, not writability, decides: a user must read the
    notices a site daemon writes there even though they cannot write there themselves."""
    uid = os.geteuid() if uid is None else uid
    if uid == 0 or site.is_dir():
        return site
    return user_state_dir(environ, uid)


def search_path(environ: Mapping[str, str] | None = None) -> list[Path]:
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    paths = [SYSTEM_CONFIG, Path(xdg) / "slurm-preempt" / "config.toml"]
    if env.get(ENV_CONFIG):
        paths.append(Path(env[ENV_CONFIG]))
    return paths


@dataclass
class Config:
    """Merged settings and the files they came from."""

    data: dict[str, Any] = field(default_factory=dict)
    sources: list[Path] = field(default_factory=list)

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"[{name}] in {self._where()} must be a table")
        return value

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return self.section(section).get(key, default)

    def state_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        """Where notices and the ledger live: env, then ``state_dir`` in the config, then the default."""
        env = os.environ if environ is None else environ
        if env.get(ENV_STATE_DIR):
            return Path(env[ENV_STATE_DIR])
        return self.configured_state_dir(env)

    def configured_state_dir(self, environ: Mapping[str, str] | None = None) -> Path:
        """``state_dir`` of the files, else ``default_state_dir`` (the env variable not consulted)."""
        if self.data.get("state_dir"):
            return Path(self.data["state_dir"]).expanduser()
        return default_state_dir(environ)

    def names_state_dir(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the env or a file chose the state folder (rather than the default)."""
        env = os.environ if environ is None else environ
        return bool(env.get(ENV_STATE_DIR) or self.data.get("state_dir"))

    def _where(self) -> str:
        return ", ".join(str(p) for p in self.sources) or "the configuration"


def merge(base: dict, override: Mapping) -> dict:
    """Deep-merge ``override`` into a copy of ``base`` (tables merge, other values replace)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def load(paths: list[Path] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and merge the config files that exist. A file named by the env var must exist."""
    env = os.environ if environ is None else environ
    config = Config()
    for path in paths if paths is not None else search_path(env):
        explicit = env.get(ENV_CONFIG) == str(path)
        if not path.exists():
            if explicit:
                raise ConfigError(f"{ENV_CONFIG} names {path}, which does not exist")
            continue
        config.data = merge(config.data, read_file(path))
        config.sources.append(path)
    return config
