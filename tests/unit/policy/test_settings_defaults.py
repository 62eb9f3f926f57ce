"""The config's defaults and the dataclasses' defaults are one set of numbers (the table, policy/table.py).

Each check compares what a proxy started without a config file uses (config.build({})) with what the
dataclasses give when built without arguments, so a default changed in one place only fails here.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import pytest

from politeproxy.config.loading import build, egress_default
from politeproxy.pacing.pacer import PacingSettings
from politeproxy.policy import settings as d
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.settings import DEFAULTS as D
from politeproxy.policy.table import DEFAULT_HOST_INTERVALS
from politeproxy.proxy.forwarding.robots_fetch import RobotsWatcher
from politeproxy.proxy.listener import Timeouts
from politeproxy.proxy.origin.upstream import Upstream


def _defaults(cls: Any) -> dict[str, Any]:
    """The keyword defaults of a class's constructor."""
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


@pytest.fixture(scope="module")
def cfg() -> Any:
    return build({})


def test_pacing_settings_match_the_config(cfg: Any) -> None:
    from_config, bare = cfg.pacing(), PacingSettings()
    assert from_config.egress == egress_default()  # the machine's host name: the one field I/O gives
    bare = replace(bare, egress=from_config.egress)
    assert from_config == bare, "config.build({}).pacing() differs from PacingSettings()"
    assert bare.gap == D.schedule.global_rate and bare.max_wait == D.pacing.max_wait
    assert bare.retries == D.pacing.retries
    assert bare.max_queue == D.pacing.max_queue
    assert bare.exempt_max_in_flight == D.exempt.max_in_flight
    assert bare.exempt_respect_backoff is D.exempt.respect_backoff
    assert bare.host_intervals == DEFAULT_HOST_INTERVALS
    index = dict(DEFAULT_HOST_INTERVALS)["index.commoncrawl.org"]
    assert bare.interval_for("index.commoncrawl.org") == index == 1.0


def test_backoff_policy_matches_the_config(cfg: Any) -> None:
    p = cfg["pacing"]
    b = BackoffPolicy()
    assert (p["backoff_base"], p["backoff_cap"], p["backoff_jitter"]) == (b.base, b.cap, b.jitter)
    assert (b.base, b.factor, b.cap, b.jitter) == (
        D.pacing.backoff_base,
        2.0,
        D.pacing.backoff_cap,
        D.pacing.backoff_jitter,
    )


def test_client_timeouts_match_the_config(cfg: Any) -> None:
    c, t = cfg["client"], Timeouts()
    assert (t.handshake, t.header, t.idle, t.max_header_size, t.max_connections) == (
        c["handshake_timeout"],
        c["header_timeout"],
        c["idle_timeout"],
        c["max_header_size"],
        c["max_connections"],
    )


def test_upstream_defaults_match_the_config(cfg: Any) -> None:
    u, up = cfg["upstream"], _defaults(Upstream)
    assert up["connect_timeout"] == u["connect_timeout"] == D.upstream.connect_timeout
    assert up["read_timeout"] == u["read_timeout"] == D.upstream.read_timeout
    assert up["max_connections"] == u["max_connections"] == D.upstream.max_connections
    assert up["ca_file"] == u["ca_file"]


def test_robots_defaults_match_the_config(cfg: Any) -> None:
    r, rw = cfg["robots"], _defaults(RobotsWatcher)
    assert (rw["ttl"], rw["cap"], rw["enabled"]) == (r["ttl"], r["max_crawl_delay"], r["enabled"])


def test_top_level_defaults(cfg: Any) -> None:
    assert cfg.listen == ("127.0.0.1", 3128) and cfg["listen"] == D.general.listen
    assert cfg["log_format"] == D.general.log_format
    assert cfg["tunnel_ports"] == list(D.general.tunnel_ports)
    s = cfg["schedule"]
    assert (s["backend"], s["global_rate"], s["redis_key_ttl"], s["expected_proxies"]) == (
        D.schedule.backend,
        D.schedule.global_rate,
        D.schedule.redis_key_ttl,
        D.schedule.expected_proxies,
    )
    # A default must itself pass the bounds a config value has to pass.
    for key, value in [
        ("schedule.global_rate", D.schedule.global_rate),
        ("pacing.max_wait", D.pacing.max_wait),
        ("pacing.backoff_cap", D.pacing.backoff_cap),
        ("robots.ttl", D.robots.ttl),
        ("client.idle_timeout", D.client.idle_timeout),
        ("upstream.read_timeout", D.upstream.read_timeout),
    ]:
        assert d.parse_duration(f"{value}s", key) == value  # a bare number needs a unit now
