"""``slurm-preempt testcluster``: the local multi-node Slurm cluster."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_preempt.cli import _logging
from slurm_preempt.cli._output import echo_json, json_option
from slurm_preempt.rehearsal import pyslurmbuild, versions
from slurm_preempt.rehearsal import testcluster as tc

dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    default=tc.DEFAULT_DIR,
    show_default=True,
    help="Folder holding the cluster's config, state, logs and pid files.",
)


@click.group()
def group():
    """A real multi-node Slurm cluster on this host (munge, slurmctld, several slurmd -N).

    \b
    Example:
      slurm-preempt testcluster up --preemptible 4 --standard 2
      eval "$(slurm-preempt testcluster env)"; sinfo
      slurm-preempt testcluster down
    """


@group.command()
@dir_option
@click.option("--standard", type=int, default=2, show_default=True, help="Nodes with feature standard.")
@click.option("--preemptible", type=int, default=4, show_default=True, help="Nodes with feature preemptible.")
@click.option("--cpus", type=int, default=8, show_default=True, help="CPUs declared per node.")
@click.option(
    "--port",
    type=int,
    default=tc.DEFAULT_PORT,
    show_default=True,
    help="slurmctld port; nodes take the next ones.",
)
@click.option(
    "--timeout",
    type=float,
    default=90,
    show_default=True,
    help="Seconds to wait for every node to be idle.",
)
@click.option("--hooks", is_flag=True, help="Install the prolog/epilog hooks (as `hooks install` does).")
@click.option("--accounting", is_flag=True, help="Also run slurmdbd with MariaDB so sacct works.")
@click.option(
    "--slurm",
    type=click.Choice(list(versions.RELEASES)),
    default=versions.SYSTEM,
    show_default=True,
    help="Slurm release: the host's packages, or one from a Debian root built once (debootstrap; "
    "25.11 compiled from its source tarball, $SP_SLURM_SOURCE).",
)
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but warnings and errors.")
@json_option
def up(directory, standard, preemptible, cpus, port, timeout, hooks, accounting, slurm, quiet, as_json):
    """Start the cluster (safe to run twice) and wait until every node is idle.

    With --slurm 24.11 or 26.05 the daemons and jobs run from a Debian trixie or sid root, built the
    first time into /var/cache/slurm-preempt/roots (about a minute) and reused; `testcluster env`
    then puts that release's sinfo, sbatch, scontrol, ... first on PATH. --slurm 25.11, which no Debian
    suite packages, is compiled once from slurm-25.11.7.tar.xz in a trixie root (6 to 9 min on two cores):
    $SP_SLURM_SOURCE names the tarball, else ../shared/slurm-src or /var/cache/slurm-preempt/src.

    \b
    Example:
      slurm-preempt testcluster up --dir /tmp/mycluster --preemptible 6
      slurm-preempt testcluster up --slurm 24.11 --dir /tmp/c24 --port 17200
      SP_SLURM_SOURCE=~/slurm-25.11.7.tar.xz slurm-preempt testcluster up --slurm 25.11 --dir /tmp/c25
    """
    spec = tc.ClusterSpec(
        directory=directory.absolute(),
        standard=standard,
        preemptible=preemptible,
        cpus=cpus,
        port=port,
        hooks=hooks,
        accounting=accounting,
        slurm=slurm,
    )
    if quiet or as_json:
        _logging.quiet()
    state = tc.up(spec, timeout=timeout)
    if as_json:
        echo_json(tc.status(spec.directory))
    elif not quiet:
        lines = [line for line in tc.env_lines(state) if "SLURM_PREEMPT_STATE_DIR" not in line]
        click.echo(f"testcluster: ready; to use it from another shell: {'; '.join(lines)}")


@group.command()
@dir_option
@click.option("--quiet", "-q", is_flag=True, help="Print nothing but warnings and errors.")
def down(directory, quiet):
    """Stop every process the cluster started, and the jobs still on its nodes.

    \b
    Example:
      slurm-preempt testcluster down --dir /tmp/mycluster
    """
    if quiet:
        _logging.quiet()
    tc.down(directory.absolute())


@group.command()
@dir_option
@json_option
def status(directory, as_json):
    """Show the cluster's processes and nodes; exit 1 when it is not running.

    \b
    Example:
      slurm-preempt testcluster status --json
    """
    info = tc.status(directory.absolute())
    if as_json:
        echo_json(info)
    else:
        state = "running" if info["running"] else "not running"
        release = f"--slurm {info.get('slurm', 'system')}"
        if info.get("version"):
            release += f", {info['version']}"
        click.echo(f"cluster in {info['directory']}: {state} ({release})")
        for proc in info["processes"]:
            click.echo(f"  {proc['role']:<14} pid {proc['pid']:<8} {'up' if proc['alive'] else 'gone'}")
        for node in info["nodes"]:
            flags = "+".join([node["state"], *node["flags"]])
            reason = f"  ({node['reason']})" if node["reason"] else ""
            click.echo(f"  {node['name']:<8} {flags:<22} {','.join(node['features'])}{reason}")
    if not info["running"]:
        raise SystemExit(1)


@group.command()
@dir_option
def env(directory):
    """Print the shell lines that point Slurm commands at the cluster.

    \b
    Example:
      eval "$(slurm-preempt testcluster env)"
    """
    state = tc.load_state(directory.absolute())
    if state is None:
        raise click.ClickException(f"no test cluster in {directory}: run `testcluster up` first")
    for line in tc.env_lines(state):
        click.echo(line)


@group.command()
@click.option(
    "--build",
    "build",
    type=click.Choice([name for name, r in versions.RELEASES.items() if r.suite]),
    multiple=True,
    help="Build the root of this release now if it is not there yet (repeatable).",
)
@click.option(
    "--pyslurm",
    "pyslurm_for",
    type=click.Choice(sorted(pyslurmbuild.PYSLURM)),
    multiple=True,
    help="Also build pyslurm against this source-built release's libslurm, beside its root (repeatable).",
)
@json_option
def roots(build, pyslurm_for, as_json):
    """List the Debian roots that hold other Slurm releases (and build them with --build).

    A release built from source (25.11) needs its tarball to be built ($SP_SLURM_SOURCE).

    \b
    Example:
      slurm-preempt testcluster roots --build 24.11 --build 26.05 --build 25.11
      slurm-preempt testcluster roots --build 25.11 --pyslurm 25.11
    """
    from slurm_preempt.rehearsal import rootbuild

    for name in build:
        rootbuild.ensure(versions.release(name))
    for name in pyslurm_for:
        folder = pyslurmbuild.ensure(versions.release(name))
        if not as_json:
            click.echo(pyslurmbuild.describe(folder))
    found = rootbuild.list_roots()
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo(f"no roots in {rootbuild.CACHE_DIR / 'roots'}")
    for root in found:
        click.echo(
            f"{root['name']:<20} Slurm {root['slurm']:<9} {root['megabytes']:>5} MB  "
            f"built in {root['build_seconds']:.0f} s  {root['path']}"
        )
