"""Every option of ``slurm-preempt sbatch``, declared once.

From this table come the command line (``cli/sbatch.py`` turns each entry into a click option), the keys
the ``[sbatch]`` config section accepts (``CONFIG_KEYS``), the defaults ``build_spec`` falls back on
(``DEFAULTS``), and the option reference of docs/sbatch.md (``python -m slurm_preempt.cli.reference``
writes it; a test fails when the committed page differs). It is plain data: the library never imports
click. Values are taken as text and checked by ``sbatch.options``, so a bad value is the library's one
clear line, never a click type error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from slurm_preempt.notice import DEFAULT_GRACE_SECONDS
from slurm_preempt.sbatch.options import BUILTIN_TEMPLATES, FORWARD_SIGNALS, NOTICE_SIGNALS

# How an option takes its value on the command line.
VALUE = "value"  # --name VALUE
FLAG = "flag"  # --name (true when given)
REPEAT = "repeat"  # --name VALUE, repeatable; a list in the config, which adds up with the command line
SWITCH = "switch"  # --name / --no-name
OFF = "off"  # --no-name sets the key to false (its default is true)
KINDS = (VALUE, FLAG, REPEAT, SWITCH, OFF)


@dataclass(frozen=True)
class Option:
    key: str  # the settings key: the [sbatch] config key, and the name the command line passes on
    help: str  # one sentence for --help
    metavar: str = "TEXT"
    kind: str = VALUE
    default: Any = None  # used when neither the config nor the command line gives a value
    default_text: str = ""  # shown instead of ``default``, for one that depends on other options
    config: bool = True  # a key of [sbatch]
    cli: bool = True  # an option of the command line
    action: bool = False  # what to do with the script (write, submit, ...), not a setting of it
    details: str = ""  # docs/sbatch.md only: what does not fit in one --help line

    @property
    def flag(self) -> str:
        """The option as typed: ``--job-name``, ``--no-fast-restart``, ``--sidecar`` (and ``--no-...``)."""
        name = self.key.replace("_", "-")
        return f"--no-{name}" if self.kind == OFF else f"--{name}"

    @property
    def shown_default(self) -> str:
        """The default in words, for --help and the docs ('' when there is none to show)."""
        if self.default_text:
            return self.default_text
        if self.default is None or self.kind in (FLAG, OFF, SWITCH):
            return ""
        return str(self.default)

    @property
    def help_text(self) -> str:
        shown = self.shown_default
        return f"{self.help} [default: {shown}]" if shown else self.help


def _defaults_of(options: tuple[Option, ...]) -> dict[str, Any]:
    return {o.key: o.default for o in options if o.default is not None}


OPTIONS: tuple[Option, ...] = (
    # --------------------------------------------------------------------------- what runs, and where
    Option(
        "template",
        "Template by name, or your own .j2 file.",
        "|".join((*BUILTIN_TEMPLATES, "PATH")),
        default_text="plain; array with --array",
        details="See Templates below.",
    ),
    Option("job_name", "Job name.", "NAME", default_text="the command's script name"),
    Option(
        "nodes",
        "Node count, or a range to start (and restart) on what is free.",
        "N|MIN-MAX",
        details="`2-4` starts on whatever is free and restarts on whatever it gets.",
    ),
    Option("ntasks_per_node", "Tasks per node.", "N"),
    Option("cpus_per_task", "CPUs per task.", "N"),
    Option("gpus_per_node", "GPUs per node.", "[TYPE:]N"),
    Option("gres", "Generic resources, e.g. gpu:8.", "LIST"),
    Option("mem", "Memory per node, e.g. 64G.", "SIZE"),
    Option("time", "Time limit, e.g. 12:00:00 or 1-00:00:00.", "TIME"),
    Option("partition", "Partition.", "NAME"),
    Option("account", "Account.", "NAME"),
    Option("qos", "Quality of service.", "NAME"),
    Option("constraint", "Node features.", "EXPR", default="preemptible"),
    Option("standard", "No constraint: run on any node.", kind=FLAG),
    Option(
        "output",
        "Log path.",
        "PATTERN",
        default="%x-%j.out",
        default_text="%x-%j.out, arrays %x-%A_%a.out; on Slurm 25.11+ %x-%j.%r.out",
        details="One stable log, appended to by every attempt: the job id does not change across requeues. "
        "On Slurm 25.11+ (see --slurm-version) one log per attempt instead: Slurm puts the restart count "
        "in place of %r. An --output you give is used as it is.",
    ),
    Option(
        "slurm_version",
        "The cluster's Slurm release, e.g. 26.05.",
        "X.Y|auto",
        default="auto",
        default_text="auto: sinfo --version",
        details="Decides the default log name: 25.11+ expands %r (the restart count) in file names, "
        "and whether --expedite is possible.",
    ),
    Option("error", "Separate stderr log.", "PATTERN", default_text="with the output"),
    Option("mail_user", "Mail address for Slurm's mails.", "ADDRESS"),
    Option("mail_type", "Mail events, e.g. END,FAIL,REQUEUE.", "EVENTS"),
    Option("chdir", "Working folder of the job.", "DIR"),
    Option("array", "Array indexes, e.g. 0-9%2 (uses the array template).", "RANGE"),
    # --------------------------------------------------------------------------- the script's shell
    Option(
        "env",
        "Export a variable (repeat).",
        "NAME=VALUE",
        kind=REPEAT,
        details="The value is shell-quoted. In the config a table works too: "
        '`env = { OMP_NUM_THREADS = "8" }`.',
    ),
    Option(
        "setup",
        "Shell line run first, e.g. module load (repeat).",
        "LINE",
        kind=REPEAT,
        details="`module load cuda`, `source venv/bin/activate`: shell code by design, one line each.",
    ),
    Option(
        "sbatch",
        "Any other sbatch option (repeat).",
        "--OPT[=VALUE]",
        kind=REPEAT,
        details="`--sbatch=--exclusive`; checked against sbatch's own list, minus the options set here.",
    ),
    Option("comment", "Your own job comment (the opt-in tokens are added).", "TEXT"),
    # --------------------------------------------------------------------------- checkpoints
    Option(
        "checkpoint_root",
        "Folder under which each job gets its checkpoint folder.",
        "DIR",
        default_text="~/checkpoints",
        cli=False,
    ),
    Option(
        "checkpoint_dir",
        "Checkpoint folder (SLURM_PREEMPT_CHECKPOINT_DIR).",
        "DIR",
        default_text="CHECKPOINT_ROOT/JOB_NAME",
        details="`.../task-N` per array task. A non-empty folder means restart.",
    ),
    Option(
        "checkpoint_interval",
        "Handed to the command as SLURM_PREEMPT_CHECKPOINT_INTERVAL; auto: Young/Daly.",
        "N|auto",
        details="`auto` computes the Young/Daly interval (seconds) from `--checkpoint-seconds` and "
        "`--mtbp`, or learns both from earlier jobs with `--learn-from`; a `Run` of the resume library "
        "then takes it as its default and adapts it at every save to its measured saves and the "
        "watcher's live preemption rate (SLURM_PREEMPT_CHECKPOINT_INTERVAL_AUTO=1).",
    ),
    Option(
        "checkpoint_seconds",
        "For auto: how long one checkpoint takes.",
        "SECONDS",
        details="`slurm-preempt report` prints the mean it measured.",
    ),
    Option(
        "mtbp",
        "For auto: mean time between preemptions.",
        "SECONDS",
        details="`slurm-preempt report` prints the one it observed.",
    ),
    Option(
        "learn_from",
        "For auto: take both from this earlier job's history (repeat to pool jobs).",
        "JOBID",
        kind=REPEAT,
        config=False,
        details="The same figures `slurm-preempt report` prints for those jobs (ledger, and sacct -D when "
        "accounting answers); `--checkpoint-seconds` or `--mtbp`, when given, win.",
    ),
    Option("resume_flag", "Appended to the command on restart (repeat).", "ARG", kind=REPEAT),
    # --------------------------------------------------------------------------- preemption
    Option(
        "notice_signal",
        "Signal the watcher sends the batch shell.",
        "|".join((*NOTICE_SIGNALS, "none")),
        default="USR1",
        details="Opt-in token `signal=`.",
    ),
    Option(
        "forward_signal",
        "Signal passed on to the command.",
        "|".join((*FORWARD_SIGNALS, "none")),
        default="TERM",
        details="`none` for programs that read `$SLURM_PREEMPT_NOTICE` themselves.",
    ),
    Option(
        "fallback_after",
        "Move to standard nodes after K preemptions.",
        "K",
        details="Opt-in token: the watcher moves the pending job to `--fallback-to` nodes.",
    ),
    Option("fallback_pending", "... or after pending this long.", "SECONDS"),
    Option(
        "fallback_deadline",
        "... or once it can no longer finish by this UTC time.",
        "ISO-TIME",
        details="Opt-in token: when the job waits after a preemption, the watcher moves it if the steps "
        "left, at the rate it saved steps since its first start, no longer fit before this time "
        "(`Run(total_steps=N)` or `resume progress` report them).",
    ),
    Option(
        "fallback_storm",
        "... or after N attempts in a row saved no newer checkpoint.",
        "N",
        details="Opt-in token: a restart storm is moved to `--fallback-to` nodes with its reason in "
        "`history`, instead of being requeued for ever.",
    ),
    Option(
        "fallback_cost",
        "... or once a completed run costs more than on-demand by over PERCENT (0: at all).",
        "PERCENT",
        details="Opt-in token: when the job waits after its second or later preemption, the watcher "
        "moves it if the live rate of its pool times its own measured overhead per preemption (work "
        "lost, saves, restarts) makes it dearer on preemptible nodes, at the `[report]` prices or "
        "discount (docs/watcher.md).",
    ),
    Option("fallback_to", "Constraint to fall back to.", "CONSTRAINT", default="standard"),
    Option(
        "fast_restart",
        "Keep Slurm's ~2 min requeue hold.",
        kind=OFF,
        default=True,
        details="Opt-in token `fast-restart=0`; in the config `fast_restart = false`.",
    ),
    Option(
        "expedite",
        "Slurm 25.11+: --requeue=expedite, a job whose node fails runs again at once, without the hold.",
        kind=FLAG,
        default=False,
        details="For jobs that no watcher releases: when its node is removed, Slurm requeues the job "
        "without the ~2 min hold and starts it on other nodes (measured: ~3 s on 25.11 and 26.05). Slurm "
        "refuses the job unless `SlurmctldParameters=enable_expedited_requeue` (`hooks check` says); "
        "refused here for a release before 25.11 (`--slurm-version`).",
    ),
    Option(
        "shrink",
        "With --nodes=MIN-MAX, requeue at a partial drain instead of going on without the leaving nodes.",
        kind=OFF,
        default=True,
        details="By default a job with a node range whose leaving nodes spare its batch host and at least "
        "MIN others takes its final checkpoint, gives those nodes back (`scontrol update NodeList=`) and "
        "starts its command again on the others in the same attempt (docs/resume.md, Elastic in place).",
    ),
    Option(
        "grow_back",
        "With --nodes=MIN-MAX, requeue to come back larger when idle nodes match it, at most this often.",
        "SECONDS",
        details="Opt-in tokens `grow-back=SECONDS` and `max-nodes=MAX`: a job running below MAX (shrunk, or "
        "started smaller) is told by a watcher with `grow_back = true`, through a notice, to take its final "
        "checkpoint and requeue; the watcher releases it at once and Slurm starts it on up to MAX nodes "
        "(never more often than the watcher's `grow_back_min_window`).",
    ),
    Option(
        "timelimit_notice",
        "Treat the time limit as a preemption, warned this early.",
        "SECONDS",
        details="`#SBATCH --signal=B:USR1@SECONDS`, so a run can outlive the partition's MaxTime.",
    ),
    Option(
        "sidecar",
        "Start a per-job drain watcher beside the command.",
        kind=SWITCH,
        default=False,
        details="`slurm-preempt watch --sidecar --job $SLURM_JOB_ID --grace S`, skipped with one log line "
        "if that command is missing.",
    ),
    Option(
        "grace", "Drain-to-removal time the sidecar assumes.", "SECONDS", default=int(DEFAULT_GRACE_SECONDS)
    ),
    Option(
        "lightning",
        "Launch a plain Lightning script Lightning's own way.",
        kind=SWITCH,
        default=False,
        details="The command runs under `srun` (one task per node unless `--ntasks-per-node` says "
        "otherwise; with a `--nodes` range that count goes on `srun`, since sbatch's would get MIN nodes "
        "only), so Lightning detects SLURM and installs its requeue handler; the notice is passed "
        "on as SIGUSR1 (Lightning's requeue signal, unless `--forward-signal` names another), on which "
        "Lightning saves its hpc checkpoint and requeues the job.",
    ),
    # --------------------------------------------------------------------------- torchrun template
    Option("nproc_per_node", "torchrun: processes per node.", "N", default_text="GPUs per node, else 1"),
    Option("rdzv_port", "torchrun: rendezvous port.", "PORT", default=29500),
    Option("torchrun", "torchrun: the executable.", "PATH", default_text="this install's"),
    # --------------------------------------------------------------------------- what to do with it
    Option("write", "Write the script to this file.", "PATH", config=False, action=True),
    Option("submit", "Submit it with sbatch and print the job id.", kind=FLAG, config=False, action=True),
    Option(
        "test_only",
        "Ask sbatch --test-only whether the cluster would take it.",
        kind=FLAG,
        config=False,
        action=True,
    ),
    Option(
        "explain",
        "Say in plain words what the script does on preemption.",
        kind=FLAG,
        config=False,
        action=True,
    ),
    Option("json", "Print JSON for scripts.", kind=FLAG, config=False, action=True),
)

BY_KEY = {o.key: o for o in OPTIONS}
CONFIG_KEYS = frozenset(o.key for o in OPTIONS if o.config)
SETTING_KEYS = frozenset(o.key for o in OPTIONS if not o.action)
ACTION_KEYS = tuple(o.key for o in OPTIONS if o.action)
LIST_KEYS = frozenset(o.key for o in OPTIONS if o.kind == REPEAT)
DEFAULTS = _defaults_of(OPTIONS)


def cli_options() -> Iterator[Option]:
    return (o for o in OPTIONS if o.cli)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_reference() -> str:
    """The option reference of docs/sbatch.md: one row per option, in --help order."""
    rows = [
        "| option | `[sbatch]` key | default | what it does |",
        "|---|---|---|---|",
    ]
    for o in OPTIONS:
        if o.cli:
            typed = o.flag if o.kind in (FLAG, OFF) else f"{o.flag} {o.metavar}"
            if o.kind == SWITCH:
                typed = f"{o.flag} / --no-{o.key.replace('_', '-')}"
            option = f"`{_cell(typed)}`"
        else:
            option = "(config only)"
        key = f"`{o.key}`" if o.config else ""
        default = o.shown_default or ("true" if o.default is True else "")
        default = f"`{_cell(default)}`" if default and not o.default_text else _cell(default)
        text = o.help + (f" {o.details}" if o.details else "")
        rows.append(f"| {option} | {key} | {default} | {_cell(text)} |")
    return "\n".join(rows) + "\n"
