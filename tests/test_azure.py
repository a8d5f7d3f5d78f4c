"""Azure Scheduled Events: the documented document parsed event by event, and the source against the
local metadata server (the ``Metadata: true`` header, acknowledgement by ``StartRequests`` once)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apiserver import ApiServer
from slurm_preempt.watch.azure import AzureScheduledEventsSource, parse_scheduled_events
from slurm_preempt.watch.sources import NodeMap, SourceError

NOW = datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc)


def _rfc1123(moment: datetime) -> str:
    return format_datetime(moment, usegmt=True)  # "Tue, 01 Dec 2026 06:00:30 GMT", as Azure writes it


def _event(event_id="602d9444-d2cd-49c7-8624-8643e7171297", kind="Preempt", resources=("pre1",), **extra):
    event = {
        "EventId": event_id,
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "EventStatus": "Scheduled",
        "NotBefore": _rfc1123(NOW + timedelta(seconds=30)),
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    return {**event, **extra}


def _parse(events, node="pre1", node_map=None, seen=None, problems=None):
    node_map = NodeMap() if node_map is None else node_map
    doc = {"DocumentIncarnation": 3, "Events": events}
    problems = [] if problems is None else problems
    return parse_scheduled_events(doc, node, node_map, {} if seen is None else seen, problems, now=NOW)


def test_a_preempt_event_of_this_vm_is_a_drain_whose_deadline_is_not_before():
    found = _parse([_event()])
    drain = found["602d9444-d2cd-49c7-8624-8643e7171297"]
    assert (drain.node, drain.source, drain.grace) == ("pre1", "azure", 30.0)
    assert drain.drain_time + timedelta(seconds=drain.grace) == NOW + timedelta(seconds=30)
    assert "Preempt" in drain.reason


def test_only_removals_of_this_vm_count():
    events = [
        _event("a", kind="Reboot"),  # the VM stays
        _event("b", kind="Freeze"),
        _event("c", resources=("pre2",)),  # a neighbour in the placement group
        _event("d", kind="Terminate", resources=("PRE1",)),  # Azure's VM names ignore case
    ]
    assert set(_parse(events)) == {"d"}


def test_provider_names_are_renamed_like_the_other_sources():
    node_map = NodeMap.from_config(r"vm-spot-(\d+)", r"pre\1")
    assert set(_parse([_event(resources=("vm-spot-1",))], node_map=node_map)) == {
        "602d9444-d2cd-49c7-8624-8643e7171297"
    }


def test_a_started_event_without_not_before_is_due_from_the_first_read():
    seen: dict = {}
    started = _event("s", EventStatus="Started", NotBefore="")
    drain = _parse([started], seen=seen)["s"]
    assert drain.drain_time + timedelta(seconds=drain.grace) == NOW
    assert seen == {"s": NOW}
    _parse([], seen=seen)
    assert seen == {}  # the event is gone: forgotten


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("not an event", "not an object"),
        (_event(event_id=None), "without a valid EventId"),
        (_event(event_id="x; rm -rf /"), "without a valid EventId"),
        (_event(Resources="pre1"), "Resources is not a list"),
        (_event(NotBefore="soon"), "not an RFC 1123 time"),
        (_event(NotBefore=""), "no NotBefore"),
        (_event(NotBefore="Mon, 01 Jan 2480 00:00:00 GMT"), "out of range"),
    ],
)
def test_a_bad_event_is_skipped_alone_with_its_reason(bad, why):
    problems: list[str] = []
    found = _parse([bad, _event("good")], problems=problems)
    assert set(found) == {"good"}
    assert len(problems) == 1 and why in problems[0]


def test_a_document_without_events_fails_the_read():
    for doc in ([], {"DocumentIncarnation": 1}, {"Events": {}}):
        with pytest.raises(SourceError, match="no Events list"):
            parse_scheduled_events(doc, "pre1", NodeMap(), {}, [])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=40),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
        max_leaves=30,
    )
)
def test_any_event_gives_a_drain_nothing_or_one_problem(event):
    problems: list[str] = []
    found = _parse([event], problems=problems)
    assert len(found) + len(problems) <= 1


def test_the_source_sends_the_header_and_acknowledges_each_event_once(caplog):
    with ApiServer() as server:
        source = AzureScheduledEventsSource("pre1", server.base_url, timeout=2)
        assert source.fetch() == []
        server.azure_events = [_event("e1", NotBefore=_rfc1123(datetime.now(timezone.utc))), "garbage"]
        with caplog.at_level(logging.WARNING, logger="slurm_preempt.watch.azure"):
            assert [d.node for d in source.fetch()] == ["pre1"]
            source.fetch()  # the same bad event again: not logged again
        assert [r.message for r in caplog.records] == ["azure: an event skipped ('not an object')"]
        source.told({"pre2"})
        assert server.azure_acks == []  # not this node's
        source.told({"pre1"})
        source.told({"pre1"})
        assert server.azure_acks == [{"StartRequests": [{"EventId": "e1"}]}]
        gets = [r for r in server.requests if r["method"] == "GET"]
        assert gets and all(r["headers"].get("Metadata") == "true" for r in server.requests)
        assert all(r["path"] == "/metadata/scheduledevents?api-version=2020-07-01" for r in server.requests)


def test_a_failed_acknowledgement_is_tried_again():
    with ApiServer() as server:
        source = AzureScheduledEventsSource("pre1", server.base_url, timeout=2)
        server.azure_events = [_event("e1")]
        source.fetch()
        server.mode = "error"
        source.told({"pre1"})  # HTTP 500: logged, not taken as acknowledged
        assert server.azure_acks == [] and source.acknowledged == set()
        server.mode = "good"
        source.told({"pre1"})
        assert server.azure_acks == [{"StartRequests": [{"EventId": "e1"}]}]
        assert source.acknowledged == {"e1"}


def test_a_server_that_is_not_the_documented_shape_is_a_source_error():
    with ApiServer() as server:
        source = AzureScheduledEventsSource("pre1", server.base_url, timeout=2)
        for mode, why in (("malformed", "not JSON"), ("shape", "no Events list"), ("error", "HTTP 500")):
            server.mode = mode
            with pytest.raises(SourceError, match=why):
                source.fetch()


# ---------------------------------------------------------------------------------------- the drill

# Checkpoints only when told to stop (SIGTERM, which the job script passes on at the notice), resumes
# from that checkpoint: a final checkpoint is all that stands between the notice and lost work.
PROGRAM = r"""
import json, os, signal, sys, time
ck = os.path.join(os.environ["SLURM_PREEMPT_CHECKPOINT_DIR"], "final.json")
os.makedirs(os.path.dirname(ck), exist_ok=True)
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
step = json.load(open(ck))["step"] if os.path.exists(ck) else 0
print(json.dumps({"event": "start", "step": step}), flush=True)
while step < 100000 and not stop:
    time.sleep(0.1)
    step += 1
with open(ck + ".tmp", "w") as f:
    json.dump({"step": step}, f)
os.replace(ck + ".tmp", ck)
print(json.dumps({"event": "saved", "step": step}), flush=True)
"""


@pytest.mark.cluster
def test_a_preempt_event_is_noticed_checkpointed_requeued_and_acknowledged_once(
    clean_cluster, tmp_path, monkeypatch
):
    from clusterutil import lift_requeue_hold, submit_generated, wait_for
    from slurm_preempt import ledger
    from slurm_preempt.notice import notice_path, read_notice

    cl = clean_cluster
    with ApiServer() as server:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[watch]\nsources = ["slurm", "azure"]\nazure_metadata_url = "{server.base_url}"\n'
            "sidecar_interval = 0.5\n"
        )
        (tmp_path / "prog.py").write_text(PROGRAM)
        monkeypatch.setenv("SLURM_PREEMPT_CONFIG", str(config))  # sbatch passes it on to the sidecar
        work = tmp_path / "job"
        job_id = submit_generated(
            cl, work, ["--sidecar", "--grace", "30", "--output", str(work / "job.log")],
            ["python3", str(tmp_path / "prog.py")],
        )  # fmt: skip
        node = cl.wait_state(job_id, "RUNNING", 60).nodes[0]
        log = work / "job.log"
        started = lambda: log.exists() and '"event": "start"' in log.read_text()  # noqa: E731
        wait_for(started, 30, what="the program started")
        wait_for(lambda: len(server.requests) >= 2, 30, what="the sidecar reading the scheduled events")
        not_before = datetime.now(timezone.utc) + timedelta(seconds=30)
        server.azure_events = [
            {"EventId": "bad-1", "EventType": "Preempt", "Resources": "not-a-list"},
            {"EventId": "bad-2", "EventType": "Preempt", "Resources": [node], "NotBefore": "soon"},
            _event("a1b2c3d4-0000-4000-8000-000000000001", resources=(node,), NotBefore=_rfc1123(not_before)),
        ]
        notice = wait_for(lambda: read_notice(notice_path(cl.spec.state_dir, job_id)), 30, what="the notice")
        assert notice.source == "azure" and notice.node == node
        assert abs((notice.deadline - not_before).total_seconds()) < 1  # NotBefore has whole seconds
        cl.wait_state(job_id, "PENDING", 60)  # the script requeued the job after the final checkpoint
        server.azure_events = []  # the VM is gone: so are its events
        cl.slurm.drain([node], "Azure Spot eviction")  # and Slurm keeps the restart off it
        wait_for(lambda: lift_requeue_hold(cl.slurm, job_id), 60, what="the requeue hold lifted")
        cl.wait_state(job_id, "RUNNING", 60)
        starts = wait_for(lambda: _lines(log, "start")[1:], 30, what="the second attempt's start")
        saved = _lines(log, "saved")
        assert saved and starts[0]["step"] == saved[0]["step"] > 0  # nothing redone
        assert server.azure_acks == [{"StartRequests": [{"EventId": "a1b2c3d4-0000-4000-8000-000000000001"}]}]
        text = log.read_text()
        assert text.count("azure: an event skipped") == 2, text  # once each, though read every 0.5 s
        assert "notice_sent" in [e["kind"] for e in ledger.events(cl.spec.state_dir, job_id)]
        cl.slurm.cancel_many([job_id])


def _lines(log, event: str) -> list[dict]:
    import json

    return [
        json.loads(line) for line in log.read_text().splitlines() if line.startswith(f'{{"event": "{event}"')
    ]
