"""The sbatch generator without a cluster: option checks, rendering, bad input, quoting.

The #SBATCH lines are read back with a port of sbatch's own line parser (Slurm 22.05
src/sbatch/opt.c: _get_argument and the scan that stops at the first command line), and the
command's argv is read back by running the rendered script's shell with bash. The same properties
are proven on the real cluster in test_sbatch_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_preempt.cli import main as cli_main
from slurm_preempt.cli.sbatch import command as sbatch_command
from slurm_preempt.config import Config
from slurm_preempt.errors import ConfigError, UsageError
from slurm_preempt.optin import parse as parse_optin
from slurm_preempt.sbatch import render as gen
from slurm_preempt.sbatch.options import parse_env, parse_nodes, parse_time
from slurm_preempt.sbatch.optiontable import SETTING_KEYS

EMPTY = Config()


def make(command=("python", "train.py"), config=EMPTY, **options):
    return gen.generate(options, list(command), config)


# ------------------------------------------------------------------------------ sbatch's line parser


def slurm_get_argument(text: str) -> tuple[str | None, int]:
    """Port of sbatch's _get_argument: one argument and how many characters it used."""
    i = 0
    while i < len(text) and text[i].isspace():
        i += 1
    if i < len(text) and text[i] == ":":
        raise ValueError("sbatch: Unexpected `:`")
    if i >= len(text):
        return None, i
    out, escape, quote = [], False, ""
    while i < len(text) and (quote or not text[i].isspace()) and text[i] != "\n":
        ch = text[i]
        if escape:
            escape = False
        elif ch == "\\":
            escape, i = True, i + 1
            continue
        elif quote:
            if ch == quote:
                quote, i = "", i + 1
                continue
        elif ch in "\"'":
            quote, i = ch, i + 1
            continue
        elif ch == "#":
            break
        out.append(ch)
        i += 1
    if quote:
        raise ValueError("sbatch: Unmatched quote")
    return ("".join(out) if out else None), i


def slurm_directives(script: str) -> list[str]:
    """The argv sbatch builds from a script's #SBATCH lines (it stops at the first command)."""
    args = []
    for line in script.split("\n")[1:]:
        if line.startswith("#SBATCH"):
            rest = line[len("#SBATCH") :]
            while True:
                arg, used = slurm_get_argument(rest)
                if arg is None:
                    break
                args.append(arg)
                rest = rest[used:]
        elif line.strip() and not line.strip().startswith("#"):
            break
    return args


def options_of(script: str) -> dict[str, list[str | None]]:
    found: dict[str, list[str | None]] = {}
    for arg in slurm_directives(script):
        name, sep, value = arg[2:].partition("=")
        assert arg.startswith("--"), arg
        found.setdefault(name, []).append(value if sep else None)
    return found


# ------------------------------------------------------------------------------ values and defaults


def test_defaults_target_preemptible_nodes_requeue_and_append():
    opts = options_of(make().script)
    assert opts["constraint"] == ["preemptible"]
    assert opts["requeue"] == [None]
    assert opts["open-mode"] == ["append"]
    assert opts["output"] == ["%x-%j.out"]
    assert opts["job-name"] == ["train"]
    assert parse_optin(opts["comment"][0]).signal == "USR1"


def test_standard_drops_the_constraint_and_constraint_replaces_it():
    assert "constraint" not in options_of(make(standard=True).script)
    assert options_of(make(constraint="preemptible&h100").script)["constraint"] == ["preemptible&h100"]


def test_optin_tokens_map_from_options_and_keep_the_users_comment():
    made = make(
        comment="my run",
        notice_signal="usr2",
        fallback_after="3",
        fallback_pending="1800",
        fast_restart=False,
    )
    comment = options_of(made.script)["comment"][0]
    # Our tokens first: the watcher reads the first 512 bytes of a comment.
    assert comment.startswith("slurm-preempt:signal=USR2 ") and comment.endswith(" my run")
    optin = parse_optin(comment)
    assert (optin.signal, optin.fallback_after, optin.fallback_pending, optin.fast_restart) == (
        "USR2",
        3,
        1800,
        False,
    )
    assert "trap 'sp_on_notice USR2' USR2" in made.script


def test_notice_signal_none_traps_nothing_but_term():
    made = make(notice_signal="none", forward_signal="none")
    assert parse_optin(options_of(made.script)["comment"][0]).signal is None
    assert "sp_on_notice USR" not in made.script
    assert "trap sp_on_term TERM" in made.script


def test_timelimit_notice_adds_a_batch_signal_and_traps_it():
    made = make(time="1:00:00", timelimit_notice="600", notice_signal="none")
    assert options_of(made.script)["signal"] == ["B:USR1@600"]
    assert "trap 'sp_on_notice USR1' USR1" in made.script


def test_array_template_gets_per_task_output_and_checkpoints():
    made = make(array="0-9%2")
    assert made.spec.template == "array"
    opts = options_of(made.script)
    assert opts["array"] == ["0-9%2"]
    assert opts["output"] == ["%x-%A_%a.out"]
    assert '/task-$SLURM_ARRAY_TASK_ID"' in made.script


def test_config_gives_defaults_and_the_command_line_wins(tmp_path):
    config = Config(
        data={
            "state_dir": "/shared/sp",
            "sbatch": {
                "partition": "gpu",
                "account": "lab",
                "checkpoint_root": "/data/ckpt",
                "setup": ["module load cuda"],
                "env": {"OMP_NUM_THREADS": "4"},
                "notice_signal": "USR2",
            },
        }
    )
    made = make(config=config, partition="spot", setup=("source venv/bin/activate",))
    opts = options_of(made.script)
    assert opts["partition"] == ["spot"] and opts["account"] == ["lab"]
    assert made.spec.checkpoint_dir == "/data/ckpt/train"
    assert made.spec.setup == ["module load cuda", "source venv/bin/activate"]
    assert "export OMP_NUM_THREADS=4" in made.script
    assert "sp_default_state_dir=/shared/sp" in made.script
    assert made.spec.notice_signal == "USR2"


def test_unknown_config_key_is_a_config_error():
    with pytest.raises(ConfigError, match="partitoin"):
        make(config=Config(data={"sbatch": {"partitoin": "gpu"}}))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", "1"), ("4", "4"), ("2-4", "2-4"), (" 2 - 4 ", "2-4"), ("3-3", "3-3")],
)
def test_nodes_accepts_counts_and_ranges(text, expected):
    assert parse_nodes(text) == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("5:30", 330),
        ("1:00:00", 3600),
        ("2-12", 216000),
        ("1-0:30", 88200),
        ("UNLIMITED", None),
    ],
)
def test_time_accepts_slurms_forms(text, seconds):
    assert parse_time(text) == seconds


def test_resume_flag_is_appended_only_on_restart():
    made = make(resume_flag=("--resume-from-latest",))
    appended = 'if [ "$SLURM_PREEMPT_RESTART" = 1 ]; then\n        sp_cmd+=( --resume-from-latest )'
    assert appended in made.script


def test_a_node_range_shrinks_in_place_unless_told_not_to():
    """--nodes=MIN-MAX: the command leaves the requeue to the script, which tries the shrink first."""
    ranged = make(nodes="2-3").script
    assert "export SLURM_PREEMPT_SCRIPT_DECIDES=2" in ranged
    assert "resume shrink --min-nodes 2 --wait-steps 300" in ranged and "resume requeue" in ranged
    for fixed in (make(nodes="3").script, make(nodes="2-3", shrink=False).script, make(nodes="2-2").script):
        assert "SLURM_PREEMPT_SCRIPT_DECIDES" not in fixed and "resume shrink" not in fixed


def test_on_several_nodes_the_script_requeues_and_names_the_file_for_it():
    """--nodes above 1: the command leaves the requeue to the script (job/requeue.py); one node: the
    variable is only cleared, never inherited from the submitting shell."""
    named = 'SLURM_PREEMPT_SCRIPT_REQUEUES="$SLURM_PREEMPT_CHECKPOINT_DIR/.requeue-$SLURM_JOB_ID-'
    for several in (make(nodes="2").script, make(nodes="1-3").script, make(nodes="2-3", shrink=False).script):
        assert named in several and "resume requeue" in several
    for one in (make().script, make(nodes="1").script):
        assert "export SLURM_PREEMPT_SCRIPT_REQUEUES=  #" in one
        assert named not in one and "resume requeue" not in one


def test_sidecar_uses_this_installs_executable_and_survives_its_absence():
    made = make(sidecar=True, grace="20")
    assert f"sp_exe={gen.slurm_preempt_executable()}" in made.script
    assert '"$sp_exe" watch --sidecar --job "$SLURM_JOB_ID" --grace 20 &' in made.script
    assert "running without it" in made.script


def test_torchrun_template_uses_the_allocation_and_the_node_address():
    made = make(command=("train.py", "--lr", "3e-4"), template="torchrun", nodes="2-4", rdzv_port="29555")
    script = made.script
    assert 'scontrol show node "$sp_first_node"' in script and "NodeAddr=" in script
    assert '--nnodes="$SLURM_JOB_NUM_NODES"' in script
    assert '--rdzv-endpoint="$SLURM_PREEMPT_RDZV_ENDPOINT"' in script
    assert 'SLURM_PREEMPT_RDZV_ENDPOINT="$sp_rdzv_host:29555"' in script
    assert options_of(script)["nodes"] == ["2-4"]


@pytest.mark.parametrize(
    ("command", "no_python"),
    [
        (("python", "train.py"), True),
        (("python3.11", "-m", "pkg.train"), True),
        (("/opt/venv/bin/python3", "train.py"), True),
        (("train.py", "--lr", "3e-4"), False),
        (("pythonic.py",), False),
    ],
)
def test_torchrun_runs_a_leading_interpreter_as_given(command, no_python):
    made = make(command=command, template="torchrun", nodes="2")
    assert ("--no-python" in made.script) is no_python
    explained = gen.explain(made.spec)
    assert ("torchrun runs `" in explained) is no_python


def test_torchrun_agent_ignores_usr_signals_and_waits_the_grace_for_its_workers():
    script = make(
        command=("train.py",), template="torchrun", nodes="2", grace="120", torchrun="/opt/t/torchrun"
    ).script
    assert 'bash -c \'trap "" USR1 USR2; exec "$@"\' torchrun-agent' in script
    assert 'TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-120}"' in script


def test_this_installs_torchrun_runs_through_the_quiet_agent():
    torchrun = str(Path(sys.executable).parent / "torchrun")
    script = make(command=("train.py",), template="torchrun", nodes="2", torchrun=torchrun).script
    assert (
        f"{shlex.quote(sys.executable)} -m slurm_preempt.job.torchagent\n    {shlex.quote(torchrun)}"
        in script
    )
    assert "torchrun-agent" not in script


def test_user_template_gets_the_documented_variables(tmp_path):
    path = tmp_path / "mine.sh.j2"
    path.write_text(
        '{% extends "_base.sh.j2" %}\n{% block setup %}echo {{ spec.job_name|sh }} {{ command_line|sh }}\n'
        "{% endblock %}\n"
    )
    made = make(template=str(path), job_name="mine")
    assert "echo mine 'python train.py'" in made.script
    assert options_of(made.script)["job-name"] == ["mine"]


def test_explain_speaks_of_drain_removal_restart_and_time_limit():
    text = gen.explain(make(timelimit_notice="300", time="2:00:00", resume_flag=("--resume",)).spec)
    for words in ("At a drain", "At removal", "On restart", "At the time limit", "--resume", "SIGTERM"):
        assert words in text


def test_explain_keeps_a_values_own_newlines_and_has_no_empty_paragraphs():
    text = gen.explain(make(command=("python", "-c", "print(1)\n\n\nprint(2)"), standard=True).spec)
    assert "`python -c 'print(1)\n\n\nprint(2)'` on any node (--standard)," in text
    paragraphs = text.split("\n\n")
    assert text.endswith(".\n") and not text.endswith("\n\n") and all(p.strip() for p in paragraphs)


@pytest.mark.parametrize(
    ("source", "prose"),
    [
        ("One\ntwo.\n\nThree.\n", "One two.\n\nThree.\n\n"),
        ("A\n{% if x %}\nb\n{% else %}\nc\n{% endif %}\nd.\n", "A{% if x %} b{% else %} c{% endif %} d.\n\n"),
        ("{% if x %}\n\nOptional.\n\n{% endif %}\n\nLast.", "{% if x %}Optional.\n\n{% endif %}Last.\n\n"),
        ("{# a comment\n\nover lines #}\n  Indented\n  words.  \n", "Indented words.\n\n"),
    ],
)
def test_prose_templates_join_lines_and_end_paragraphs(source, prose):
    assert gen.prose_source(source) == prose


# ------------------------------------------------------------------------------ bad input via the CLI


def run_cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli_main, ["sbatch", *args], env=env)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "4-2", "--", "x"], "MIN is larger than MAX"),
        (["--nodes", "0", "--", "x"], "at least 1 node"),
        (["--time", "25:99", "--", "x"], "99 seconds is out of range"),
        (["--template", "nosuch", "--", "x"], "unknown template 'nosuch'"),
        (["--sbatch", "--bogus", "--", "x"], "--bogus is not an sbatch option"),
        (["--sbatch", "--open-mode=truncate", "--", "x"], "set by slurm-preempt sbatch"),
        (["--sbatch", "--uid=0", "--", "x"], "set by slurm-preempt sbatch"),
        (["--sbatch", "--partition=x", "--", "x"], "use --partition"),
        (["--sbatch", "-N 2", "--", "x"], "long sbatch option"),
        ([], "no command given"),
        (["--job-name", "a\n#SBATCH --uid=0", "--", "x"], "must be one line"),
        (["--job-name", "my hetjob", "--", "x"], "job separator"),
        (["--comment", "a\x00b", "--", "x"], "NUL"),
        (["--notice-signal", "KILL", "--", "x"], "--notice-signal 'KILL'"),
        (["--forward-signal", "STOP", "--", "x"], "--forward-signal 'STOP'"),
        (["--checkpoint-interval", "-5", "--", "x"], "positive number or auto"),
        (["--time", "10", "--timelimit-notice", "900", "--", "x"], "not shorter than --time"),
        (["--template", "array", "--", "x"], "needs --array"),
        (["--env", "1X=2", "--", "x"], "NAME=VALUE"),
        (["--setup", "a\nb", "--", "x"], "one shell line"),
        (["--mem", "lots", "--", "x"], "--mem 'lots' is not valid"),
        (["--write", "/", "--", "x"], "is a folder"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args, message):
    result = run_cli(*args)
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_template_with_an_undefined_variable_is_one_line(tmp_path):
    path = tmp_path / "bad.sh.j2"
    path.write_text("#!/bin/bash\necho {{ no_such_thing }}\n")
    result = run_cli("--template", str(path), "--", "x")
    assert result.exit_code == 2
    assert result.output.strip() == f"Error: template {path}: 'no_such_thing' is undefined"


def test_checkpoint_interval_auto_needs_its_two_figures():
    result = run_cli("--checkpoint-interval", "auto", "--", "x")
    assert result.exit_code == 2 and "--checkpoint-seconds" in result.output
    assert len(result.output.strip().splitlines()) == 1
    # Every option the message tells the user to pass exists (it once named two that did not).
    named = set(re.findall(r"--[a-z][a-z-]+", result.output))
    assert {"--checkpoint-seconds", "--mtbp", "--learn-from"} <= named
    existing = {name for param in sbatch_command.params for name in param.opts}
    assert named <= existing, named - existing


def test_checkpoint_interval_auto_from_the_command_line():
    """The documented command line: it ran into click's "No such option: --checkpoint-seconds"."""
    from slurm_preempt.records.report import advise_interval

    result = run_cli(
        "--checkpoint-interval", "auto", "--checkpoint-seconds", "60", "--mtbp", "3600", "--", "true"
    )
    assert result.exit_code == 0, result.output
    advised = round(advise_interval(60.0, 3600.0)["advised_seconds"])
    assert advised == 618  # Daly: sqrt(2 * 60 * 3600) * (1 + sqrt(c/2m)/3 + (c/2m)/9) - 60 = 617.9
    assert f"\nexport SLURM_PREEMPT_CHECKPOINT_INTERVAL={advised}\n" in result.output
    assert result.output.startswith("#!/bin/bash\n")


def test_checkpoint_figures_may_come_from_the_config(tmp_path):
    from slurm_preempt.records.report import advise_interval

    config = tmp_path / "config.toml"
    config.write_text("[sbatch]\ncheckpoint_seconds = 60\nmtbp = 3600\n")
    result = run_cli("--checkpoint-interval", "auto", "--", "true", env={"SLURM_PREEMPT_CONFIG": str(config)})
    assert result.exit_code == 0 and "SLURM_PREEMPT_CHECKPOINT_INTERVAL=618\n" in result.output
    faster = run_cli(
        "--checkpoint-interval",
        "auto",
        "--mtbp",
        "900",
        "--",
        "true",
        env={"SLURM_PREEMPT_CONFIG": str(config)},
    )
    advised = round(advise_interval(60.0, 900.0)["advised_seconds"])  # the command line wins: M = 900 s
    assert advised != 618 and f"SLURM_PREEMPT_CHECKPOINT_INTERVAL={advised}\n" in faster.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--checkpoint-seconds", "0", "--mtbp", "60"],
            "--checkpoint-seconds 0: must be more than 0 seconds",
        ),
        (["--checkpoint-seconds", "60", "--mtbp", "often"], "--mtbp 'often' is not a number of seconds"),
        (["--checkpoint-seconds", "nan", "--mtbp", "60"], "--checkpoint-seconds nan: must be more than 0"),
    ],
)
def test_bad_checkpoint_figures_are_one_line(args, message):
    result = run_cli("--checkpoint-interval", "auto", *args, "--", "true")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {message}"), result.output


def test_checkpoint_interval_auto_uses_the_reports_advice():
    from slurm_preempt.records.report import advise_interval

    made = make(checkpoint_interval="auto", checkpoint_seconds="90", mtbp="7200")
    expected = round(advise_interval(90.0, 7200.0)["advised_seconds"])
    assert made.spec.checkpoint_interval == str(expected)
    assert 900 < expected < 1300  # sqrt(2 * 90 * 7200) = 1138, less Daly's correction
    assert f"export SLURM_PREEMPT_CHECKPOINT_INTERVAL={expected}" in made.script


def documented_run() -> tuple[list[str], str, str]:
    """The command line of docs/sbatch.md's --explain transcript, its output, and the script shown for it."""
    page = (Path(__file__).parent.parent / "docs" / "sbatch.md").read_text()
    transcript = page.split("`slurm-preempt sbatch --explain` for a typical job (real output):\n\n```\n", 1)[
        1
    ]
    transcript = transcript.split("```", 1)[0]
    prompt, output = transcript.split(" -- python train.py --lr 3e-4\n", 1)
    argv = shlex.split(prompt.replace("\\\n", " ").removeprefix("$ slurm-preempt sbatch"))
    shown = page.split("real output of the same command without `--explain`):\n\n```bash\n", 1)[1]
    return [*argv, "--", "python", "train.py", "--lr", "3e-4"], output, shown.split("```", 1)[0]


def test_the_documented_transcripts_are_what_sbatch_prints_today():
    argv, explained, script = documented_run()
    ctx = sbatch_command.make_context("sbatch", list(argv))
    options = {k: v for k, v in ctx.params.items() if k in SETTING_KEYS}
    made = gen.generate(options, list(ctx.params["command"]), EMPTY)
    assert ctx.params["explain"] and gen.explain(made.spec) == explained
    assert made.script == script


def test_cli_prints_writes_and_explains(tmp_path):
    printed = run_cli("--nodes", "2", "--", "python", "train.py")
    assert printed.exit_code == 0 and printed.output.startswith("#!/bin/bash\n#SBATCH --job-name=train\n")
    target = tmp_path / "job.sh"
    written = run_cli("--nodes", "2", "--write", str(target), "--json", "--", "python", "train.py")
    assert written.exit_code == 0 and json.loads(written.output) == {"script": str(target)}
    assert target.read_text() == printed.output and os.access(target, os.X_OK)
    explained = run_cli("--explain")
    assert explained.exit_code == 0 and "At a drain" in explained.output
    helped = run_cli("--help")
    assert "Example:" in helped.output


# ------------------------------------------------------------------------------ hypothesis: quoting

# Printable text (what a user may type) is taken literally; any control character is refused.
PRINTABLE = st.characters(
    exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"), include_characters=" "
)
LINE_TEXT = st.text(PRINTABLE, min_size=1, max_size=40)
BAD_CHARS = st.sampled_from(["\n", "\r", "\x00", "\t", "\x1b", "\u2028", "\x85"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=LINE_TEXT, comment=LINE_TEXT, output=LINE_TEXT, mail=LINE_TEXT, begin=LINE_TEXT)
def test_sbatch_lines_read_back_exactly_or_are_refused(name, comment, output, mail, begin):
    try:
        made = make(
            job_name=name, comment=comment, output=output, mail_user=mail, sbatch=(f"--begin={begin}",)
        )
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    opts = options_of(made.script)
    assert opts["job-name"] == [name]
    assert opts["output"] == [output]
    assert opts["mail-user"] == [mail]
    assert opts["begin"] == [begin]
    assert opts["comment"] == [made.spec.comment]
    assert " ".join(comment.split()) in made.spec.comment  # merge_comment normalises spaces
    # No value added a directive: exactly the options the spec asked for, in order.
    assert [a.split("=", 1)[0] for a in slurm_directives(made.script)] == [
        f"--{n}" for n, _v in made.spec.sbatch_options()
    ]


@settings(max_examples=100, deadline=None)
@given(value=LINE_TEXT, bad=BAD_CHARS, where=st.integers(min_value=0, max_value=40))
def test_a_control_character_anywhere_is_refused(value, bad, where):
    poisoned = value[:where] + bad + value[where:]
    for option in ("job_name", "comment", "output", "mail_user", "partition", "chdir"):
        with pytest.raises(UsageError):
            make(**{option: poisoned})
    with pytest.raises(UsageError):
        make(sbatch=(f"--begin={poisoned}",))


def run_locally(script: str, tmp: Path) -> list[str]:
    """Run the rendered script with bash outside Slurm (it only needs SLURM_JOB_ID) and read argv."""
    path = tmp / "job.sh"
    path.write_text(script)
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "1",
        "SLURM_PREEMPT_STATE_DIR": str(tmp / "state"),
        "HOME": str(tmp),
    }
    proc = subprocess.run(
        ["bash", str(path)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp / "log").write_text(proc.stdout + proc.stderr)
    return json.loads((tmp / "argv.json").read_text())


def argv_dumper(out: Path) -> list[str]:
    return [sys.executable, "-c", "import json,sys; json.dump(sys.argv[1:], open(sys.argv[1],'w'))", str(out)]


ARG_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(ARG_TEXT, max_size=5), env_value=ARG_TEXT)
def test_command_argv_reaches_the_command_exactly(tmp_path_factory, args, env_value):
    tmp = tmp_path_factory.mktemp("argv")
    command = [*argv_dumper(tmp / "argv.json"), *args]
    made = make(command=command, checkpoint_dir=str(tmp / "ckpt"), env=(f"SP_TEST_VALUE={env_value}",))
    assert run_locally(made.script, tmp) == [str(tmp / "argv.json"), *args]
    assert not Path("/tmp/sp-sbatch-pwned").exists()


def test_awkward_arguments_stay_literal(tmp_path):
    awkward = [
        "$(touch /tmp/sp-sbatch-pwned)",
        "`touch /tmp/sp-sbatch-pwned`",
        "a'b\"c",
        "x; rm -rf /",
        "a\nb",
        "ünï ☃",
    ]
    made = make(command=[*argv_dumper(tmp_path / "argv.json"), *awkward], checkpoint_dir=str(tmp_path / "c"))
    assert run_locally(made.script, tmp_path)[1:] == awkward
    assert not Path("/tmp/sp-sbatch-pwned").exists()


def test_missing_sidecar_is_one_log_line_and_the_job_still_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "slurm_preempt_executable", lambda: "/nonexistent/slurm-preempt")
    made = make(
        command=[*argv_dumper(tmp_path / "argv.json"), "ok"], sidecar=True, checkpoint_dir=str(tmp_path / "c")
    )
    assert run_locally(made.script, tmp_path) == [str(tmp_path / "argv.json"), "ok"]
    assert (tmp_path / "log").read_text().count("no sidecar watcher") == 1


def test_a_non_empty_checkpoint_folder_means_restart_even_without_a_restart_count(tmp_path):
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    (ckpt / "step-100").write_text("x")
    made = make(
        command=[*argv_dumper(tmp_path / "argv.json"), "go"],
        resume_flag=("--resume",),
        checkpoint_dir=str(ckpt),
    )
    assert run_locally(made.script, tmp_path) == [str(tmp_path / "argv.json"), "go", "--resume"]
    assert "attempt 1 (restart 0)" in (tmp_path / "log").read_text()
    (ckpt / "step-100").unlink()
    assert run_locally(made.script, tmp_path) == [str(tmp_path / "argv.json"), "go"]


# ------------------------------------------------------------------------------ hostile names


def test_an_env_name_with_a_final_newline_is_refused():
    """Finding 9: `$` matched before a trailing newline, so `--env $'FOO\\n=x'` passed the name check."""
    with pytest.raises(UsageError):
        parse_env("FOO\n=x")


@pytest.mark.parametrize("job_name", ["a/b", "../../etc/x", "x/" * 30, "é/\n"])
def test_a_kept_script_never_lands_under_a_folder_named_by_the_job(tmp_path, monkeypatch, job_name):
    """Finding 8: a job name with `/` put the kept script under /tmp/slurm-preempt-<first part>/, a
    folder another user can create first."""
    from slurm_preempt.sbatch import render

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "slurm-preempt-a").mkdir()  # planted by another user
    path = render.keep_script("#!/bin/bash\n", job_name)
    assert path.parent == tmp_path and path.name.startswith("slurm-preempt-")
    assert os.listdir(tmp_path / "slurm-preempt-a") == []


def test_lightning_runs_the_command_under_srun_one_task_per_node_with_the_notice_as_usr1():
    made = gen.generate(
        {"lightning": True, "nodes": "2", "slurm_version": "none"}, ["python", "train.py"], Config()
    )
    spec = made.spec
    assert spec.command == ["srun", "python", "train.py"] and spec.lightning
    assert (spec.forward_signal, spec.ntasks_per_node) == ("USR1", 1)
    assert "#SBATCH --ntasks-per-node=1\n" in made.script
    given = gen.generate(
        {"lightning": True, "forward_signal": "TERM", "ntasks_per_node": "4", "slurm_version": "none"},
        ["/usr/bin/srun", "python", "train.py"],
        Config(),
    ).spec
    assert given.command == ["/usr/bin/srun", "python", "train.py"]  # never srun twice
    assert (given.forward_signal, given.ntasks_per_node) == ("TERM", 4)  # what the user says wins
    plain = gen.generate({"slurm_version": "none"}, ["python", "train.py"], Config()).spec
    assert plain.command == ["python", "train.py"] and not plain.lightning


def test_expedite_asks_for_requeue_expedite_only_where_sbatch_knows_it():
    """--requeue=expedite (25.11+): an older sbatch refuses the whole script, so the generator refuses
    first, in one line; an unknown release is refused too (the user names it with --slurm-version)."""
    made = gen.generate({"expedite": True, "slurm_version": "25.11"}, ["python", "train.py"], Config())
    assert "#SBATCH --requeue=expedite\n" in made.script and "#SBATCH --requeue\n" not in made.script
    assert "not held" in gen.explain(made.spec)
    plain = gen.generate({"slurm_version": "26.05"}, ["python", "train.py"], Config())
    assert "#SBATCH --requeue\n" in plain.script and "expedite" not in plain.script
    for release, said in (("24.11", "Slurm 24.11"), ("none", "an unknown release")):
        with pytest.raises(UsageError, match=f"--expedite needs Slurm 25.11 or later; .*{said}"):
            gen.generate({"expedite": True, "slurm_version": release}, ["python", "t.py"], Config())
    result = CliRunner().invoke(
        cli_main, ["sbatch", "--expedite", "--slurm-version", "22.05", "--", "python", "t.py"]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "22.05" in result.output


def test_lightning_with_a_node_range_asks_srun_for_the_tasks_per_node_not_sbatch():
    """sbatch --nodes=2-3 --ntasks-per-node=1 gets 2 nodes (2 tasks asked): the count goes on srun."""
    made = gen.generate(
        {"lightning": True, "nodes": "2-3", "slurm_version": "none"}, ["python", "train.py"], Config()
    )
    assert made.spec.command == ["srun", "--ntasks-per-node", "1", "python", "train.py"]
    assert made.spec.ntasks_per_node is None and "#SBATCH --ntasks-per-node" not in made.script
    given = gen.generate(
        {"lightning": True, "nodes": "2-4", "ntasks_per_node": "2", "slurm_version": "none"},
        ["srun", "--cpu-bind=none", "python", "train.py"],
        Config(),
    ).spec
    assert given.command == ["srun", "--ntasks-per-node", "2", "--cpu-bind=none", "python", "train.py"]
