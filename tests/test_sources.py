"""Sources of drains: Slurm node rules (pure), the Together API and cloud metadata against a local server."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apiserver import ApiServer
from slurm_preempt import ids
from slurm_preempt.errors import ConfigError
from slurm_preempt.notice import to_text
from slurm_preempt.slurm import parse
from slurm_preempt.watch import sources
from slurm_preempt.watch.sources import DrainRules, NodeMap, SourceError, TogetherSource

NOW = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)


def _node(name, state="MIXED", flags=("DRAIN",), features=("preemptible",), reason="x"):
    return parse.Node(name, state, frozenset(flags), tuple(features), reason, NOW, "root")


def test_rules_feature_include_exclude():
    rules = DrainRules.from_strings("preemptible", [r"^TogetherPreemptionNotified"], [r"^maint"])
    assert rules.counts(_node("pre1", reason="anything"))
    assert not rules.counts(_node("pre1", flags=()))  # not drained
    assert rules.counts(_node("std1", features=("standard",), reason="TogetherPreemptionNotified: x"))
    assert not rules.counts(_node("std1", features=("standard",), reason="disk"))
    assert not rules.counts(_node("pre1", reason="maintenance window"))
    assert rules.counts(_node("pre1", state="DOWN", flags=(), reason="Not responding"))
    assert rules.counts(_node("pre1", reason="TogetherPreemptionNotified: slurm-preempt drill"))


def test_rules_bad_regex_is_config_error():
    with pytest.raises(ConfigError, match="exclude_reasons"):
        DrainRules.from_strings("preemptible", [], ["("])


def test_slurm_drains_keep_the_recorded_time(data_dir):
    nodes = parse.parse_nodes((data_dir / "slurm-22.05" / "sinfo_nodes.bin").read_bytes())
    drained = [n for n in nodes if (n.drain or n.down) and n.has_feature("preemptible")]
    assert {n.name for n in drained} == {"pre1", "pre4"}  # a DOWN node is going away too
    found = sources.slurm_drains(nodes, DrainRules(feature="preemptible"), grace=300, now=NOW)
    assert {d.node for d in found} == {n.name for n in drained}
    assert all(d.drain_time == n.reason_time for d, n in zip(found, drained, strict=True))


def _event(name_key="node_name", time_key="timestamp", node="gpu-preemptible-dp-3", when=NOW, **extra):
    return {"reason": "TogetherPreemptionNotified", name_key: node, time_key: to_text(when), **extra}


def test_parse_together_tolerates_field_names_and_garbage():
    nmap = NodeMap.from_config(r"gpu-preemptible-dp-(\d+)", r"pre\1")
    doc = {
        "node_lifecycle_events": [
            _event(),
            _event("node", "created_at", node="gpu-preemptible-dp-4", when=NOW + timedelta(seconds=5)),
            _event("hostname", "event_time", node="other-7"),
            {"reason": "TogetherNodeAdded", "node_name": "gpu-preemptible-dp-9", "timestamp": to_text(NOW)},
            {"reason": "TogetherPreemptionNotified"},  # no node, no time: skipped
            _event(time_key="timestamp", when=NOW - timedelta(hours=5), node="gpu-preemptible-dp-5"),  # over
            "not an event",
            {"reason": "TogetherPreemptionNotified", "node_name": "x", "timestamp": "garbage"},
        ]
    }
    drains = sources.parse_together(doc, nmap, grace=300, now=NOW + timedelta(seconds=10))
    assert {d.node: d.drain_time for d in drains} == {
        "pre3": NOW,
        "pre4": NOW + timedelta(seconds=5),
        "other-7": NOW,
    }
    assert all(d.source == "together" and d.grace == 300 for d in drains)
    epoch = sources.parse_together(
        {
            "node_lifecycle_events": [
                {"reason": "TogetherPreemptionNotified", "name": "a", "time": NOW.timestamp()}
            ]
        },
        NodeMap(),
        300,
        now=NOW,
    )
    assert epoch[0].drain_time == NOW and epoch[0].node == "a"
    with pytest.raises(SourceError):
        sources.parse_together({"status": "Ready"}, NodeMap(), 300)


def test_token_from_env_or_private_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SP_TEST_TOKEN", "from-env")
    assert sources.read_token("SP_TEST_TOKEN") == "from-env"
    monkeypatch.delenv("SP_TEST_TOKEN")
    with pytest.raises(ConfigError, match="SP_TEST_TOKEN"):
        sources.read_token("SP_TEST_TOKEN")
    path = tmp_path / "token"
    path.write_text("secret-in-file\n")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        sources.read_token("SP_TEST_TOKEN", str(path))
    os.chmod(path, 0o600)
    assert sources.read_token("SP_TEST_TOKEN", str(path)) == "secret-in-file"


def test_together_source_answers(tmp_path):
    with ApiServer(token="tok-123") as server:
        source = TogetherSource("c-1", "tok-123", 300, server.base_url, timeout=2)
        server.events = [_event(when=datetime.now(timezone.utc))]
        assert [d.node for d in source.fetch()] == ["gpu-preemptible-dp-3"]
        assert server.requests[-1]["headers"]["Authorization"] == "Bearer tok-123"
        for mode in ("malformed", "shape", "error", "slow"):
            server.mode = mode
            with pytest.raises(SourceError) as info:
                source.fetch()
            assert "tok-123" not in str(info.value)
        server.mode = "good"
        wrong = TogetherSource("c-1", "wrong", 300, server.base_url, timeout=2)
        with pytest.raises(SourceError, match="401"):
            wrong.fetch()
        assert "tok-123" not in repr(source)


def test_cloud_metadata_sources():
    with ApiServer() as server:
        aws = sources.AwsSpotSource("pre1", base_url=server.base_url, timeout=10)
        gcp = sources.GcpPreemptedSource("pre1", base_url=server.base_url, timeout=10)
        assert aws.fetch() == [] and gcp.fetch() == []
        server.aws_action = {"action": "terminate", "time": "2026-12-01T06:02:00Z"}
        server.gcp_preempted = True
        (drain,) = aws.fetch()
        assert drain.drain_time + timedelta(seconds=drain.grace) == NOW + timedelta(minutes=2)
        first = gcp.fetch()[0]
        assert gcp.fetch()[0].drain_time == first.drain_time  # first sighting stays the drain time
        server.mode = "error"
        with pytest.raises(SourceError):
            aws.fetch()


# ---------------------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize(
    "bad",
    [
        {"node_name": "pre[1"},  # finding 6: raised outside SourceError and aborted every poll
        {"node_name": "pre1,--all"},
        {"node_name": "-pre1"},
        {"node_name": "x" * 100},
        {"timestamp": "9999-12-31T23:00:00-23:00"},  # finding 6: year 10000 once made UTC
        {"timestamp": "2026-12-01T06:00:00-23:00"},  # a real offset, then still fine (kept below)
        {"timestamp": 1e300},
        {"timestamp": "1" * 5000},
        {"message": {"nested": ["not", "text"]}},
    ],
)
def test_a_bad_provider_event_is_skipped_alone(bad):
    good = _event(node="pre2", when=NOW)
    events = [_event(node="pre1", when=NOW, **bad), good]
    found = {
        d.node: d for d in sources.parse_together({"node_lifecycle_events": events}, NodeMap(), 300, NOW)
    }
    assert "pre2" in found
    assert set(found) <= {"pre1", "pre2"} and all(ids.is_node_name(n) for n in found)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
))  # fmt: skip
def test_any_provider_payload_gives_drains_or_a_source_error(payload):
    """Property: whatever the provider's API answers, the source gives valid drains or SourceError;
    nothing else escapes into the poll."""
    for document in (payload, {"node_lifecycle_events": payload}, {"node_lifecycle_events": [payload]}):
        try:
            found = sources.parse_together(document, NodeMap(), 300, NOW)
        except SourceError:
            continue
        assert all(ids.is_node_name(d.node) and d.drain_time.tzinfo for d in found)


@pytest.mark.parametrize("content", ["tok-123\nsecond-line-secret", "tok 123", "tök-1234567", "\x00" * 20])
def test_a_token_file_of_the_wrong_shape_is_refused_without_quoting_it(tmp_path, monkeypatch, content):
    """Finding 7: a token file with a second line ended up in a logged error message."""
    monkeypatch.delenv("TOGETHER_API_KEY", raising=False)
    path = tmp_path / "token"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as caught:
        sources.read_token(token_file=str(path))
    assert "secret" not in str(caught.value) and "123" not in str(caught.value).replace(str(path), "")


def test_a_header_urllib_refuses_never_reaches_an_error_message():
    with ApiServer(token="tok-123") as server:
        source = TogetherSource("c-1", "tok-123\nX-Leak: secret", 300, server.base_url, timeout=10)
        with pytest.raises(SourceError) as caught:
            source.fetch()
    assert "secret" not in str(caught.value) and "tok-123" not in str(caught.value)


def test_no_redirect_is_followed_so_the_token_never_reaches_another_host():
    """Finding 7: urllib forwards Authorization on a redirect to another host."""
    with ApiServer(token="tok-123") as api, ApiServer(token="tok-123") as elsewhere:
        api.mode, api.redirect_to = "redirect", elsewhere.base_url.replace("127.0.0.1", "localhost")
        source = TogetherSource("c-1", "tok-123", 300, api.base_url, timeout=2)
        with pytest.raises(SourceError, match="redirect"):
            source.fetch()
    assert elsewhere.requests == []
    assert "tok-123" not in repr(source)
