"""The watcher's metrics: what the events of a poll count (unit), the shipped alert rules (promtool), and
a real Prometheus scraping a real watcher during a drill on the local cluster (PromQL through its API)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from slurm_preempt import ledger
from slurm_preempt.notice import utcnow
from slurm_preempt.resources import data_dir
from slurm_preempt.watch import metrics as watchmetrics
from slurm_preempt.watch.metrics import Metrics, parse_address

RULES = data_dir("etc") / "prometheus" / "slurm-preempt.rules.yml"


def _value(m: Metrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)), ("0.0.0.0:80", ("0.0.0.0", 80)),
     ("[::1]:9464", ("::1", 9464)), ("watch-host:9464", ("watch-host", 9464))],
)  # fmt: skip
def test_an_address_is_host_and_port_bound_to_localhost_by_default(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("bad", ["", "host:", "host:0", "host:65536", "x:y", "a b:80", "1.2.3.4:80/x"])
def test_a_bad_address_is_refused(bad):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(bad)


def test_events_count_by_source_and_the_signal_latency_is_drain_to_signal(tmp_path):
    m = Metrics()
    m.bind(tmp_path, lambda node: {"pre1": "azure"}.get(node))
    m.observe(
        {"event": "drain_seen", "node": "pre1", "source": "azure", "drain_time": "2026-12-01T06:00:00Z"}
    )
    m.observe({"event": "drain_seen", "node": "x", "source": "made-up; by a user"})  # never a label value
    m.observe({"event": "notice_sent", "job_id": "7", "source_kind": "azure"})
    m.observe(
        {"event": "signal_sent", "job_id": "7", "node": "pre1", "time": "2026-12-01T06:00:04Z",
         "event_id": "pre1@2026-12-01T06:00:00Z"}
    )  # fmt: skip
    assert _value(m, "slurm_preempt_drains_total", source="azure") == 1
    assert _value(m, "slurm_preempt_drains_total", source="other") == 1
    assert _value(m, "slurm_preempt_notices_total", source="azure") == 1
    assert _value(m, "slurm_preempt_signals_total", source="azure") == 1
    assert _value(m, "slurm_preempt_signal_latency_seconds_count", source="azure") == 1
    assert _value(m, "slurm_preempt_signal_latency_seconds_sum", source="azure") == 4.0
    assert _value(m, "slurm_preempt_signal_latency_seconds_bucket", source="azure", le="5.0") == 1
    assert _value(m, "slurm_preempt_signal_latency_seconds_bucket", source="azure", le="2.0") == 0


def test_a_restarted_job_counts_saved_with_a_final_checkpoint_after_its_notice_else_lost(tmp_path):
    m = Metrics()
    m.bind(tmp_path, lambda _node: None)
    ledger.record(tmp_path, "1", "notice_sent", source="watcher")
    ledger.record(tmp_path, "1", "checkpoint_saved", source="job", final=True, step=10)
    ledger.record(tmp_path, "2", "checkpoint_saved", source="job", final=True, step=10)
    ledger.record(tmp_path, "2", "notice_sent", source="watcher")  # its final checkpoint came before
    ledger.record(tmp_path, "3", "checkpoint_saved", source="job", final=False, step=10)  # never told
    for job_id in ("1", "2", "3"):
        m.observe({"event": "fast_restart", "job_id": job_id})
    assert _value(m, "slurm_preempt_fast_restarts_total") == 3
    assert _value(m, "slurm_preempt_jobs_told_total", outcome="saved") == 1
    assert _value(m, "slurm_preempt_jobs_told_total", outcome="lost") == 1


def test_polls_count_by_outcome_and_standby_clears_the_lease_gauge():
    m = Metrics()
    m.observe_poll("ok", 0.2)
    assert _value(m, "slurm_preempt_lease_held") == 1
    m.observe_poll("slurm_error", 15.0)
    m.observe_poll("standby", 0.0)
    assert _value(m, "slurm_preempt_lease_held") == 0
    outcomes = ("ok", "slurm_error", "error", "standby")
    assert [_value(m, "slurm_preempt_polls_total", outcome=o) for o in outcomes] == [1, 1, 0, 1]
    assert _value(m, "slurm_preempt_poll_duration_seconds_count") == 2


def test_every_metric_is_served_as_openmetrics_and_no_label_is_user_text(tmp_path):
    port = _free_port()
    m = Metrics()
    m.serve("127.0.0.1", port)
    m.observe({"event": "fallback", "job_id": "5", "why": "a user's words"})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        text = answer.read().decode()
    assert text.rstrip().endswith("# EOF")
    assert "slurm_preempt_fallbacks_total 1.0" in text
    labels = {
        pair.split("=")[0]
        for line in text.splitlines()
        if "{" in line
        for pair in line[line.index("{") + 1 : line.index("}")].split(",")
    }
    assert labels <= {"outcome", "source", "le"}


def test_the_shipped_alert_rules_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing (Debian's prometheus package; scripts/setup.sh installs it)")
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_a_watcher_without_prometheus_client_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(watchmetrics.ConfigError, match=r"pip install 'slurm-preempt\[metrics\]'"):
        Metrics()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------- the drill

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_loop.py"
PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [{rules}]
scrape_configs:
  - job_name: slurm-preempt
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


@pytest.fixture
def prometheus(tmp_path):
    """Debian's Prometheus on 127.0.0.1, scraping 127.0.0.1:<port> every second; yields (port, query)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is missing (Debian's prometheus package; scripts/setup.sh installs it)")
    target, web = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_CONFIG.format(rules=RULES, port=target))
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def query(promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    try:
        from clusterutil import wait_for

        wait_for(lambda: _ready(web), 60, 0.5, what="Prometheus ready")
        yield target, query
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _scalar(query, promql: str) -> float | None:
    found = query(promql)
    return float(found[0]["value"][1]) if len(found) == 1 else None


@pytest.mark.cluster
def test_prometheus_sees_the_drain_the_notice_the_save_and_the_signal_latency(
    clean_cluster, prometheus, tmp_path
):
    from clusterutil import running_watcher, submit_generated, wait_for

    cl = clean_cluster
    port, query = prometheus
    work = tmp_path / "job"
    train = [sys.executable, str(EXAMPLE), "--steps", "4000", "--every", "1000", "--step-seconds", "0.05",
             "--result", str(work / "result.json")]  # fmt: skip
    with running_watcher(cl, tmp_path / "watch.log", 10.0, ["--metrics", f"127.0.0.1:{port}"]):
        wait_for(lambda: _scalar(query, 'up{job="slurm-preempt"}') == 1, 60, 0.5, what="the first scrape")
        job_id = submit_generated(cl, work, ["--job-name", "metrics"], train)
        try:
            node = cl.wait_state(job_id, "RUNNING", 60).nodes[0]
            # A job that started less than 3 s ago gets its notice at once, its signal later (its script may
            # not trap it yet), and Run reads the notice file by itself: it may leave before any signal.
            wait_for(
                lambda: (utcnow() - cl.job(job_id).start_time).total_seconds() > 4, 30, what="job age 4 s"
            )
            cl.slurm.drain([node], "TogetherPreemptionNotified: metrics drill")
            wait_for(lambda: (j := cl.job(job_id)) and j.restart_count == 1 and j.state == "RUNNING", 90,
                     what="the job running again")  # fmt: skip
            expected = {
                'slurm_preempt_drains_total{source="slurm"}': 1,
                'slurm_preempt_notices_total{source="slurm"}': 1,
                'slurm_preempt_signals_total{source="slurm"}': 1,
                'slurm_preempt_signal_latency_seconds_count{source="slurm"}': 1,
                'slurm_preempt_jobs_told_total{outcome="saved"}': 1,
                'slurm_preempt_jobs_told_total{outcome="lost"}': 0,
                "slurm_preempt_fast_restarts_total": 1,
                "slurm_preempt_lease_held": 1,
            }
            try:
                seen = wait_for(lambda: _all(query, expected), 30, 0.5, what="Prometheus to show the drill")
            except AssertionError:
                got = {promql: _scalar(query, promql) for promql in expected}
                raise AssertionError(f"{got}\n{(tmp_path / 'watch.log').read_text()[-3000:]}") from None
            latency = _scalar(
                query, 'histogram_quantile(0.5, slurm_preempt_signal_latency_seconds_bucket{source="slurm"})'
            )
            worst = _scalar(query, 'slurm_preempt_signal_latency_seconds_sum{source="slurm"}')
            print(
                f"signal latency (drain -> signal): {worst:.2f} s; median bucket bound {latency:.2f} s"
            )  # -s
            assert seen and worst is not None and 0 <= worst < 10
            assert _scalar(query, 'sum(rate(slurm_preempt_polls_total{outcome="ok"}[1m]))') > 0
            assert query('ALERTS{alertname="SlurmPreemptNoWatcherActing"}') == []
        finally:
            cl.slurm.cancel_many([job_id])


def _all(query, expected: dict[str, float]) -> bool:
    return all(_scalar(query, promql) == value for promql, value in expected.items())


def test_a_grow_back_is_counted_and_its_restart_is_no_told_jobs_outcome(tmp_path):
    """watch/growback.py: the job left to come back larger; nothing of it was at risk."""
    from slurm_preempt import ledger

    m = Metrics()
    m.bind(tmp_path, lambda _node: None)
    ledger.record(tmp_path, "7", "notice_sent", "watcher", event_id="pre3@2026-12-01T06:00:00Z")  # its shrink
    ledger.record(tmp_path, "7", "checkpoint_saved", "job", step=36, final=True)
    ledger.record(tmp_path, "7", "grow_back", "watcher", num_nodes_before=2, nodes=3)
    ledger.record(tmp_path, "7", "checkpoint_saved", "job", step=476, final=True)
    m.observe({"event": "grow_back", "job_id": "7"})
    m.observe({"event": "fast_restart", "job_id": "7"})
    assert _value(m, "slurm_preempt_grow_backs_total") == 1
    assert _value(m, "slurm_preempt_jobs_told_total", outcome="saved") == 0
