"""A reload's line shows each changed value in the units the config file writes (issue 45 item 6): a rate
as "200ms (5/s)", a duration as "30s", a size as "64MiB"; secrets only as changed."""

from __future__ import annotations

import pytest

from politeproxy.policy.settings import changes, format_size, in_units, parse_duration, parse_size


def test_a_reload_line_in_the_files_units() -> None:
    old = {
        "schedule": {"global_rate": 0.2},
        "pacing": {"max_wait": 30.0, "retries": 2},
        "cache": {"max_size": 10 << 30},
    }
    new = {
        "schedule": {"global_rate": 0.4},
        "pacing": {"max_wait": 0.0, "retries": 3},
        "cache": {"max_size": 5 << 30},
    }
    assert changes(old, new) == [
        "cache.max_size: 10GiB -> 5GiB",
        "pacing.max_wait: 30s -> 0s",
        "pacing.retries: 2 -> 3",
        "schedule.global_rate: 200ms (5/s) -> 400ms (2.5/s)",
    ]


def test_keyed_tables_secrets_and_unknown_keys() -> None:
    old = {"hosts": {"index.commoncrawl.org": {"interval": 1.0}}, "auth": {"users": ["a:b"]}, "x": {"y": 1.5}}
    new = {"hosts": {"index.commoncrawl.org": {"interval": 0.0}}, "auth": {"users": ["a:c"]}, "x": {"y": 2.5}}
    assert changes(old, new) == [
        "auth.users changed",
        "hosts.index.commoncrawl.org.interval: 1s (1/s) -> off",
        "x.y: 1.5 -> 2.5",
    ]
    assert in_units("schedule.global_rate", "fast") == "'fast'"  # not a number: shown as it is


@pytest.mark.parametrize("seconds", [0.001, 0.2, 1.5, 30.0, 90.0, 120.0, 3600.0, 7200.0])
def test_a_duration_shown_reads_back_as_itself(seconds: float) -> None:
    assert parse_duration(in_units("pacing.max_wait", seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("n", [1, 1000, 1 << 10, 3 << 20, 64 << 20, 10 << 30, (1 << 40) + 1])
def test_a_size_shown_reads_back_as_itself(n: int) -> None:
    assert parse_size(format_size(n), lo=0, hi=1 << 50) == n
