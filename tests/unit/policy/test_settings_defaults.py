"""The config's defaults and the dataclasses' defaults are one set of numbers (policy/settings.py).

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
from politeproxy.proxy.listener import Timeouts
from politeproxy.proxy.robots_fetch import RobotsWatcher
from politeproxy.proxy.upstream import Upstream


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
    assert bare.gap == d.GLOBAL_GAP and bare.max_wait == d.MAX_WAIT and bare.retries == d.RETRIES
    assert bare.max_queue == d.MAX_QUEUE
    assert bare.exempt_max_in_flight == d.EXEMPT_MAX_IN_FLIGHT
    assert bare.exempt_respect_backoff is d.EXEMPT_RESPECT_BACKOFF
    assert bare.host_intervals == d.HOST_INTERVALS
    assert bare.interval_for("index.commoncrawl.org") == d.INDEX_HOST_INTERVAL == 1.0


def test_backoff_policy_matches_the_config(cfg: Any) -> None:
    p = cfg["pacing"]
    b = BackoffPolicy()
    assert (p["backoff_base"], p["backoff_cap"], p["backoff_jitter"]) == (b.base, b.cap, b.jitter)
    assert (b.base, b.factor, b.cap, b.jitter) == (
        d.BACKOFF_BASE,
        d.BACKOFF_FACTOR,
        d.BACKOFF_CAP,
        d.BACKOFF_JITTER,
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
    assert up["connect_timeout"] == u["connect_timeout"] == d.CONNECT_TIMEOUT
    assert up["read_timeout"] == u["read_timeout"] == d.READ_TIMEOUT
    assert up["max_connections"] == u["max_connections"] == d.UPSTREAM_MAX_CONNECTIONS
    assert up["ca_file"] == u["ca_file"]


def test_robots_defaults_match_the_config(cfg: Any) -> None:
    r, rw = cfg["robots"], _defaults(RobotsWatcher)
    assert (rw["ttl"], rw["cap"], rw["enabled"]) == (r["ttl"], r["max_crawl_delay"], r["enabled"])


def test_top_level_defaults(cfg: Any) -> None:
    assert cfg.listen == ("127.0.0.1", 3128) and cfg["listen"] == d.LISTEN
    assert cfg["log_format"] == d.LOG_FORMAT
    assert cfg["tunnel_ports"] == list(d.TUNNEL_PORTS)
    s = cfg["schedule"]
    assert (s["backend"], s["global_rate"], s["redis_key_ttl"], s["expected_proxies"]) == (
        d.BACKEND,
        d.GLOBAL_GAP,
        d.REDIS_KEY_TTL,
        d.EXPECTED_PROXIES,
    )
    # A default must itself pass the bounds a config value has to pass.
    for key, value in [
        ("schedule.global_rate", d.GLOBAL_GAP),
        ("pacing.max_wait", d.MAX_WAIT),
        ("pacing.backoff_cap", d.BACKOFF_CAP),
        ("robots.ttl", d.ROBOTS_TTL),
        ("client.idle_timeout", d.IDLE_TIMEOUT),
        ("upstream.read_timeout", d.READ_TIMEOUT),
    ]:
        assert d.parse_duration(f"{value}s", key) == value  # a bare number needs a unit now
