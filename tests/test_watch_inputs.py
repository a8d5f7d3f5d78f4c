"""The watcher's own inputs of any shape: settings from the config, the saved state from disk."""

from __future__ import annotations

import json
import math

import pytest

from slurm_preempt.errors import ConfigError, UsageError
from slurm_preempt.watch.sentstate import SentState
from slurm_preempt.watch.settings import DEFAULTS, merged, settings_from
from slurm_preempt.watch.watcher import load_sent


@pytest.mark.parametrize("key", ["interval", "grace", "enforce_margin", "signal_after_start", "max_backoff"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_seconds_are_refused_at_start(key, value):
    """Finding 9: interval = nan polled in a busy loop, inf crashed the loop."""
    with pytest.raises(ConfigError, match="finite"):
        settings_from(merged({key: value}, {}))
    assert settings_from(merged({}, {})).interval == DEFAULTS["interval"]


@pytest.mark.parametrize(
    ("section", "overrides", "error", "says"),
    [
        (
            {"interval": 0},
            {},
            ConfigError,
            r"\[watch\] interval = 0 in site.toml: not a number of seconds > 0",
        ),
        ({"enforce": "yes"}, {}, ConfigError, r"\[watch\] enforce = 'yes' in site.toml: not true or false"),
        ({"crash_after": 2.5}, {}, ConfigError, "not a whole number >= 1"),
        ({"aws_metadata_url": "169.254.169.254"}, {}, ConfigError, "not an http:// or https:// URL"),
        ({"sources": ["slurm", "oracle"]}, {}, ConfigError, "unknown source oracle"),
        ({"grace": 60}, {"grace": -1.0}, UsageError, "--grace -1.0: not a number of seconds >= 0"),
    ],
)
def test_a_bad_value_is_one_line_naming_where_it_came_from(section, overrides, error, says):
    """A bad value in the file is a config error naming the file; one on the command line, a usage error
    naming the option."""
    with pytest.raises(error, match=says):
        merged(section, overrides, "site.toml")


@pytest.mark.parametrize(
    "content",
    [
        "[]",
        '{"events": 3}',
        '{"events": {"pre1": "x"}}',
        '{"events": {"pre1": {}}}',
        '{"events": {"pre1": {"drain_time": 5}}}',
        '{"events": {"pre1": {"drain_time": "9999-12-31T23:00:00-23:00"}}}',
        '{"told": []}',
        '{"told": {"1|pre1": 7}}',
        '{"restarts": {"1": null}}',
        "not json",
    ],
)
def test_a_saved_state_of_the_wrong_shape_is_moved_aside_never_a_crash_at_start(tmp_path, content):
    """Finding 9: a sent.json of the wrong shape crashed start-up on every restart."""
    path = tmp_path / "sent.json"
    path.write_text(content)
    state = load_sent(path)
    assert isinstance(state, SentState) and state.events == {} and state.told == {}
    assert (tmp_path / "sent.corrupt").read_text() == content
    state.save()
    assert json.loads(path.read_text())["events"] == {}
