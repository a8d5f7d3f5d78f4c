"""``slurm-preempt watch``: options, config errors, the Together source end to end, enforcement."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from apiserver import ApiServer
from clusterutil import wait_for, wait_signal_age
from slurm_preempt import ledger
from slurm_preempt.cli import main
from slurm_preempt.errors import UsageError
from slurm_preempt.notice import notice_path, read_notice, to_text
from slurm_preempt.slurm.commands import Slurm
from slurm_preempt.watch.sentstate import SentState
from slurm_preempt.watch.settings import DEFAULTS, Settings, merged, refuse_preemptible_host, settings_from
from slurm_preempt.watch.sources import AwsSpotSource
from slurm_preempt.watch.watcher import Watcher
from test_watcher import OPTED, RECORD_SCRIPT, _drain, _kinds, _records, _script, _submit

TOKEN = "sk-very-secret-0123456789"


def _run(args, **env):
    return CliRunner().invoke(main, ["watch", *args], env=env, catch_exceptions=False)


def test_help_has_an_example():
    result = _run(["--help"])
    assert result.exit_code == 0 and "Example:" in result.output and "--sidecar" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [([], "--cluster"), (["--sidecar"], "--job"), (["--cluster", "--job", "5"], "--sidecar")],
)
def test_usage_errors_are_one_line(args, needle):
    result = _run(args)
    assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output


def test_bad_config_fails_at_start(tmp_path):
    bad = tmp_path / "bad.toml"
    for text, needle in [
        ("[watch]\nintervall = 3\n", "unknown key"),
        ('[watch]\nreasons = ["("]\n', "regular expression"),
        ('[watch]\nsources = ["together"]\ncluster_id = "c1"\napi_token_env = "SP_NO_SUCH_VAR"\n', "token"),
        ('[watch]\nsources = ["aws"]\n', "--sidecar"),
        ("[watch\n", "not valid TOML"),
    ]:
        bad.write_text(text)
        result = _run(["--cluster", "--once", "--allow-preemptible-host", "--config", str(bad)])
        assert result.exit_code == 3, (text, result.output)
        assert needle in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.cluster
def test_refuses_to_run_on_a_preemptible_node(cluster):
    with pytest.raises(UsageError, match="pre2"):
        refuse_preemptible_host(Slurm(), "preemptible", hostname="pre2.example.org")
    refuse_preemptible_host(Slurm(), "preemptible", hostname="std1")


@pytest.mark.cluster
def test_together_source_tells_the_job_and_never_shows_the_token(clean_cluster, tmp_path):
    cl = clean_cluster
    job_id = _submit(cl, _script(cl, "record.sh", RECORD_SCRIPT), OPTED, "--nodelist=pre2")
    cl.wait_state(job_id, "RUNNING")
    wait_signal_age(cl.slurm, job_id)
    event_time = datetime.now(timezone.utc).replace(microsecond=0)
    with ApiServer(token=TOKEN) as server:
        server.events = [
            {
                "reason": "TogetherPreemptionNotified",
                "node_name": "gpu-preemptible-dp-2",
                "timestamp": to_text(event_time),
            }
        ]
        config = tmp_path / "watch.toml"
        config.write_text(
            "[watch]\n"
            'sources = ["slurm", "together"]\n'
            f'api_base_url = "{server.base_url}"\n'
            'cluster_id = "c-123"\n'
            "api_timeout = 1\n"
            'node_name_pattern = "gpu-preemptible-dp-(\\\\d+)"\n'
            'node_name_template = "pre\\\\1"\n'
        )
        state = tmp_path / "state"
        args = [
            "--cluster",
            "--once",
            "--json",
            "--grace",
            "30",
            "--config",
            str(config),
            "--state-dir",
            str(state),
        ]
        outputs = []
        for mode in ("good", "error", "slow", "malformed", "good"):
            server.mode = mode
            result = CliRunner().invoke(main, ["watch", *args], env={"TOGETHER_API_KEY": TOKEN})
            assert result.exit_code == 0, result.stderr
            outputs.append((result.stdout, result.stderr))
        assert all(r["headers"].get("Authorization") == f"Bearer {TOKEN}" for r in server.requests)
    for out, err in outputs:
        assert TOKEN not in out and TOKEN not in err
    told = [e for e in map(json.loads, outputs[0][0].splitlines()) if e["event"] == "notice_sent"]
    assert [t["job_id"] for t in told] == [job_id]
    assert "HTTP 500" in outputs[1][1]
    later = [json.loads(line)["event"] for out, _err in outputs[1:] for line in out.splitlines()]
    assert "notice_sent" not in later  # told once, API hiccups or not
    notice = read_notice(notice_path(state, job_id))
    assert notice.source == "together" and notice.node == "pre2" and notice.drain_time == event_time
    wait_for(lambda: any(r.startswith("usr1") for r in _records(cl, job_id)), 20, what="the handler")


@pytest.mark.cluster
def test_enforcement_requeues_a_job_still_running_at_the_deadline(clean_cluster):
    cl = clean_cluster
    job_id = _submit(cl, _script(cl, "record.sh", RECORD_SCRIPT), OPTED, "--constraint=preemptible")
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    wait_signal_age(cl.slurm, job_id)
    settings = Settings(grace=4, enforce=True, enforce_margin=2, fast_restart=False, fallback=False)
    watcher = Watcher(Slurm(), settings, SentState(), cl.spec.state_dir)
    _drain(cl, [node])
    assert watcher.poll_once().actions == {"notice_sent": 1, "signal_sent": 1}
    # The job traps the signal but stays: at deadline - margin the watcher requeues it.
    wait_for(
        lambda: watcher.poll_once().actions.get("enforced_requeue"), 20, interval=0.5, what="enforcement"
    )
    # Wait until the requeue is complete (PENDING, not COMPLETING) so the test's cleanup can cancel it.
    wait_for(lambda: (j := cl.job(job_id)).restart_count == 1 and j.reason == "BeginTime", 30, what="requeue")
    assert _kinds(cl.spec.state_dir, job_id) == ["notice_sent", "signal_sent", "enforced_requeue"]
    assert watcher.poll_once().actions == {}  # once per event
    assert ledger.events(cl.spec.state_dir, job_id)[-1]["node"] == node


@pytest.mark.cluster
def test_sidecar_hears_aws_spot_notice_from_metadata(clean_cluster):
    cl = clean_cluster
    job_id = _submit(cl, _script(cl, "record.sh", RECORD_SCRIPT), OPTED, "--constraint=preemptible")
    node = cl.wait_state(job_id, "RUNNING").nodes[0]
    wait_signal_age(cl.slurm, job_id)
    with ApiServer() as server:
        aws = AwsSpotSource(node, base_url=server.base_url, timeout=10)
        watcher = Watcher(Slurm(), Settings(grace=120), SentState(), cl.spec.state_dir, [aws], job_id=job_id)
        assert watcher.poll_once().actions == {}
        server.aws_action = {"action": "terminate", "time": "2026-12-01T08:00:00Z"}
        result = watcher.poll_once()
    assert result.actions == {"notice_sent": 1, "signal_sent": 1} and result.queries == 2
    notice = read_notice(notice_path(cl.spec.state_dir, job_id))
    assert notice.source == "aws" and to_text(notice.deadline) == "2026-12-01T08:00:00Z"
    wait_for(lambda: any(r.startswith("usr1") for r in _records(cl, job_id)), 20, what="the handler")
    cl.slurm.cancel(job_id)
    wait_for(lambda: watcher.poll_once().job_ended, 20, what="the sidecar to see its job end")


def _documented_defaults() -> dict[str, str]:
    """The ``[watch]`` table of docs/watcher.md: key -> the default as written."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "watcher.md").read_text()
    table = text.split("## Configuration: `[watch]` section", 1)[1].split("\n\n", 2)[1]
    found = {}
    for row in table.splitlines()[2:]:
        keys, default = (cell.strip() for cell in row.strip("|").split("|")[:2])
        found.update({key: default for key in re.findall(r"`(\w+)`", keys)})
    return found


def _as_written(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"{value:g}"
    if isinstance(value, list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`" if value else ""


def test_the_docs_give_every_key_with_its_one_default():
    documented = _documented_defaults()
    assert set(documented) == set(DEFAULTS)
    for key in ("aws_metadata_url", "gcp_metadata_url", "azure_metadata_url"):  # maybe one row for all
        documented[key] = _as_written(DEFAULTS[key])
    assert documented == {key: _as_written(value) for key, value in DEFAULTS.items()}
    assert Settings() == settings_from(merged({}, {}))  # the dataclass takes its defaults from DEFAULTS
    help_text = " ".join(_run(["--help"]).output.split())
    for key in ("grace", "interval"):
        assert f"[config: {DEFAULTS[key]:g}]" in help_text
