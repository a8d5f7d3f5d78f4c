"""Job scripts that survive preemption: render, explain, write and submit them.

A script is a jinja2 template (``templates/*.j2``) rendered with StrictUndefined from a checked
``JobSpec`` (``sbatch_options``). Values are quoted by code: the ``sh`` filter (``shlex.quote``) for
the shell, ``sbatch_quote`` for ``#SBATCH`` lines. Templates never quote by hand.

Variables a template (built-in or ``--template PATH``) receives:

    spec            the JobSpec (spec.job_name, spec.nodes, spec.checkpoint_dir, spec.forward_signal,
                    spec.trap_signals, spec.resume_flags, spec.env, spec.setup, spec.rdzv_port, ...)
    sbatch_lines    the ``#SBATCH ...`` lines, already checked and quoted
    command         the command's argv (a list: quote each with ``|sh``)
    command_line    the command as one shell-quoted line
    state_dir       the slurm-preempt state folder from the config (notices live under it)
    exe             the slurm-preempt executable of this install (for the sidecar)
    agent_python    this install's Python, when torchrun is this install's (torchrun's quiet agent)
    version         slurm-preempt's version
    template_name   the template's name

A user template may ``{% extends "_base.sh.j2" %}`` and override its blocks (sbatch, environment,
setup, command, announce, sidecar, requeue), or stand alone.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext

from slurm_preempt import __version__
from slurm_preempt.config import Config
from slurm_preempt.config import load as load_config
from slurm_preempt.errors import SlurmError, UsageError
from slurm_preempt.resources import data_dir
from slurm_preempt.sbatch.auto_interval import with_learned_figures
from slurm_preempt.sbatch.build import build_spec
from slurm_preempt.sbatch.options import BUILTIN_TEMPLATES, sbatch_quote
from slurm_preempt.sbatch.spec import JobSpec, merge_settings
from slurm_preempt.slurm.commands import Slurm

_BARE = re.compile(r"^[A-Za-z0-9_.,:/%@+=\-]+$")


@dataclass
class Generated:
    """A rendered script and the spec it came from."""

    spec: JobSpec
    script: str
    template_path: Path


def generate(
    cli: dict[str, Any], command: list[str], config: Config | None = None, slurm: Slurm | None = None
) -> Generated:
    """Check the options (config ``[sbatch]`` then ``cli``) and render the script. ``slurm`` answers
    ``sacct`` for ``learn_from`` (see ``auto_interval``)."""
    config = config if config is not None else load_config()
    section = config.section("sbatch")
    settings = merge_settings(section, with_learned_figures(cli, section, config.state_dir(), slurm))
    if str(settings.get("slurm_version") or "auto").lower() == "auto":
        settings["slurm_version"] = detect_slurm_version()
    spec = build_spec(settings, list(command))
    if not settings.get("torchrun"):
        spec.torchrun = torchrun_executable()
    # Baked as the script's default (the submitting environment's $SLURM_PREEMPT_STATE_DIR, which
    # sbatch passes on, still wins at run time): the folder a `watch --user` of this user picks too.
    state_dir = str(config.configured_state_dir())
    return Generated(spec=spec, script=render(spec, state_dir), template_path=template_path(spec.template))


def detect_slurm_version() -> tuple[int, int] | None:
    """The Slurm release of this host's client commands (``Slurm.version``, which needs no slurm.conf),
    asked once per process and PATH; None when there is no Slurm here or it does not answer in time."""
    return _ask_version(os.environ.get("SLURM_CONF"), os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=8)
def _ask_version(_conf: str | None, _path: str) -> tuple[int, int] | None:
    try:
        return Slurm(timeout=5).version()
    except (SlurmError, ValueError):
        return None


# ------------------------------------------------------------------------------------------ rendering


def template_path(name: str) -> Path:
    """A built-in template by name, or a user's template file by path."""
    if name in BUILTIN_TEMPLATES:
        return data_dir("templates") / f"{name}.sh.j2"
    path = Path(name).expanduser()
    if "/" not in name and not name.endswith(".j2"):
        raise UsageError(
            f"unknown template {name!r}: choose {', '.join(BUILTIN_TEMPLATES)} or a path to a .j2 file"
        )
    if not path.is_file():
        raise UsageError(f"template {name} does not exist")
    return path.resolve()


def environment(search: list[Path]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in search]),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - shell scripts, quoted by the filters below
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["sh"] = lambda value: shlex.quote(str(value))
    env.filters["sbatch_quote"] = lambda value: sbatch_quote(str(value))
    return env


def render(spec: JobSpec, state_dir: str) -> str:
    path = template_path(spec.template)
    env = environment([path.parent, data_dir("templates")])
    context = {
        "spec": spec,
        "sbatch_lines": sbatch_lines(spec),
        "command": spec.command,
        "command_line": shlex.join(spec.command),
        "state_dir": state_dir,
        "exe": slurm_preempt_executable(),
        "agent_python": agent_python(spec.torchrun),
        "version": __version__,
        "template_name": spec.template if spec.template in BUILTIN_TEMPLATES else path.name,
    }
    try:
        return env.get_template(path.name).render(context)
    except jinja2.UndefinedError as exc:
        raise UsageError(f"template {path}: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise UsageError(f"template {exc.filename or path}, line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise UsageError(f"template {path}: cannot find {exc.name}") from None


def sbatch_lines(spec: JobSpec) -> list[str]:
    lines = []
    for name, value in spec.sbatch_options():
        if value is None:
            lines.append(f"#SBATCH --{name}")
        elif _BARE.fullmatch(value):  # `$` alone matches before a final newline
            lines.append(f"#SBATCH --{name}={value}")
        else:
            lines.append(f"#SBATCH --{name}={sbatch_quote(value)}")
    return lines


def slurm_preempt_executable() -> str:
    """The slurm-preempt command of this very install, so the job runs the same version."""
    sibling = Path(sys.executable).parent / "slurm-preempt"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("slurm-preempt") or "slurm-preempt"


def agent_python(torchrun: str) -> str:
    """This install's Python when ``torchrun`` is this install's too (so it has slurm_preempt and torch),
    to run torchrun's agent quietly (``job/torchagent.py``); else "" (torchrun runs as it is)."""
    if Path(torchrun).is_absolute() and Path(torchrun).parent == Path(sys.executable).parent:
        return sys.executable
    return ""


def torchrun_executable() -> str:
    sibling = Path(sys.executable).parent / "torchrun"
    if sibling.is_file():
        return str(sibling)
    return shutil.which("torchrun") or "torchrun"


# ------------------------------------------------------------------------------------------ output


def write_script(script: str, path: Path) -> Path:
    """Write the script (executable) to ``path``."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--write {path} is a folder; give a file name")
    path.write_text(script)
    path.chmod(0o755)
    return path


def keep_script(script: str, job_name: str) -> Path:
    """A file for a script submitted without --write, kept so the job can be read back later.

    Created (O_EXCL, mode 0600 until written) directly in the temporary folder, under a name made only
    of the job name's safe characters: a ``/`` in a job name once put it under ``/tmp/<first part>/``,
    a folder any other user could create first and swap files in."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_name)[:40]
    fd, name = tempfile.mkstemp(prefix=f"slurm-preempt-{safe}-", suffix=".sh")
    with os.fdopen(fd, "w") as handle:
        handle.write(script)
    os.chmod(name, 0o755)
    return Path(name)


def submit(path: Path, slurm: Slurm | None = None) -> str:
    return (slurm or Slurm()).submit(str(path))


def test_only(path: Path, slurm: Slurm | None = None) -> str:
    """``sbatch --test-only``: raises SlurmError when sbatch refuses the script."""
    return (slurm or Slurm()).submit(str(path), test_only=True)


# ------------------------------------------------------------------------------------------ explain

EXPLAIN_TEMPLATE = "explain.txt.j2"
_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)
_TAG_LINE = re.compile(r"\{%.*%\}")


def explain(spec: JobSpec) -> str:
    """What the script does, in plain words, for the options given (``templates/explain.txt.j2``)."""
    text = (
        _prose_environment()
        .get_template(EXPLAIN_TEMPLATE)
        .render(spec=spec, command_line=shlex.join(spec.command))
    )
    return text.removesuffix("\n")  # every paragraph ends with a blank line; the text with one newline


class _Prose(jinja2.ext.Extension):
    """Text templates written as prose (``prose_source``), so a paragraph need not be one long line."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return prose_source(source)


def prose_source(source: str) -> str:
    """Template source as prose: comments dropped; the lines of a paragraph (a blank line ends one)
    joined with one space, a line holding only a tag without one, and no space before a paragraph's
    first words; a paragraph with words ends with a blank line. A paragraph a condition may leave out
    therefore stands between tag lines that are paragraphs of their own. Applied to the source only:
    values rendered into it keep their own newlines."""
    paragraphs = re.split(r"\n[ \t]*\n", _COMMENT.sub("", source))
    return "".join(_prose_paragraph(p.splitlines()) for p in paragraphs)


def _prose_paragraph(raw_lines: list[str]) -> str:
    out, words = "", False
    for line in (raw.strip() for raw in raw_lines):
        if not line:
            continue
        if _TAG_LINE.fullmatch(line):
            out += line
        else:
            out += (" " if words else "") + line
            words = True
    return out + "\n\n" if words else out


@functools.lru_cache(maxsize=1)
def _prose_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - plain text for a terminal
        keep_trailing_newline=True,
        extensions=[_Prose],
    )
    env.filters["repr"] = repr
    return env
