"""The request window per egress and service (issue 24 items 1 and 2), counted from the upstream's own
arrival log, with two real proxy processes sharing one store and clients of every class at once:

- with the defaults, paced GETs and exempt range reads together stay under Common Crawl's block rule on
  their own: no 20 s holds more than 15 x 20 + 100 requests at data.commoncrawl.org;
- with a small window (60 per 10 s) and a schedule and exempt ceiling far above it, the window is what
  holds: no trailing 10 s above 60, across both proxies and every class, on a data dir and on Redis, and
  the clients it refuses get a 503 that names the window.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.upstream_proc import Upstream
from tests.support.window_load import DATA, TABLE, Answer, data_arrivals, load, trailing

pytestmark = pytest.mark.slow

NO_CACHE = "[cache]\nenabled = false\n"  # repeated reads: the pacing is measured, not the cache

redis_server = redis_fixture(scope="module")


# -- the defaults -------------------------------------------------------------------------------------------


def test_defaults_keep_two_proxies_under_the_block_rule(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    """Defaults (paced 5/s, exempt 10/s after a burst of 90, one data dir): 15/s per service at most."""
    shared = tmp_path / "shared"
    a = proxy_factory(upstream, NO_ROBOTS + NO_CACHE, data_dir=shared)
    b = proxy_factory(upstream, NO_ROBOTS + NO_CACHE, data_dir=shared)
    # 25 s of load: the busiest 20 s starts at the first request (it holds the exempt burst of 90; a later
    # window holds less of it, down to the rates alone, 300) and lies wholly inside the load, with 5 s of
    # slide to spare. 40 s until 2026-12-06: the suite's longest test, its last 20 s only ever the rates.
    answers = load([a.env, b.env], 25.0, paced=3, exempt=5)
    ts = data_arrivals(upstream)
    start, most = trailing(ts, 20.0)
    # On the schedule a 20 s window holds 20 x 5 + 1 paced slots and 20 x 10 + 90 + 1 exempt ones: 392.
    # The 8 left to 400 are late grants (a grant that reaches the upstream late, followed by the next on
    # time): about half a second of them at 15/s, on this noisy 2-core box.
    assert most <= 15 * 20 + 100, f"{most} requests in the 20 s from {start - ts[0]:.2f} s; bound 400"
    span = ts[-1] - ts[0]
    print(f"defaults: busiest 20 s {most} (bound 400), {len(ts)} in {span:.1f} s")
    assert {x.status for x in answers} <= {200, 206, 503}, {x.status for x in answers}
    # Loosely: the schedule and the ceiling, not the clients, set the pace (15/s would give 600).
    assert len(ts) >= 0.6 * 15 * span, (len(ts), span)


# -- a small window: the window holds ------------------------------------------------------------------------

WINDOW, LIMIT = 10.0, 60
SMALL = (
    NO_CACHE
    + f'[egress]\nname = "nat-a"\nwindow = "{WINDOW:g}s"\nlimit = {LIMIT}\n'
    + '[exempt]\nrate = "5ms"\nburst = 100\nmax_in_flight = 16\n'
    + '[pacing]\nmax_wait = "3s"\n'
)


def schedule(extra: str = "") -> str:
    return f'[schedule]\nglobal_rate = "20ms"\n{extra}'


def assert_window_held(up: Upstream, answers: list[Answer]) -> None:
    ts = data_arrivals(up)
    paths = [a["path"] for a in up.log() if a["host"] == DATA]
    robots = sum(p == "/robots.txt" for p in paths)
    assert robots >= 1, "robots.txt is on: its fetch is a request that leaves and counts"
    start, most = trailing(ts, WINDOW)
    # The stores grant at most 60 slots in any 10 s. An arrival comes a little after its slot: one granted
    # late can land in the next window beside the first one granted on time there (61). More is a fault.
    assert most <= LIMIT + 1, f"{most} requests in the 10 s from {start - ts[0]:.2f} s; the limit is {LIMIT}"
    span = ts[-1] - ts[0]
    paced, exempt = sum(p.startswith("/size/") for p in paths), sum(p.startswith(TABLE) for p in paths)
    print(f"window: busiest 10 s {most} (limit {LIMIT}), {len(ts)} in {span:.1f} s", end=" ")
    print(f"({paced} paced, {exempt} exempt, {robots} robots.txt; {len(answers)} answers)")
    assert len(ts) >= LIMIT, len(ts)  # loosely: the first window filled
    kinds = {(x.klass, x.status) for x in answers}
    assert ("paced", 200) in kinds and (("exempt", 206) in kinds or ("exempt", 200) in kinds), kinds
    refused = [x for x in answers if x.status == 503]
    assert refused, "the schedule and the ceiling are far above the window: it must have refused some"
    named = [x for x in refused if b"request window" in x.body]
    other = {x.body[:120] for x in refused if x not in named}
    print(f"  503s: {len(refused)}, {len(named)} naming the window; others: {sorted(other)[:3]}")
    # Every refusal says why: the window, or (on a box loaded enough that the schedule falls behind, seen once
    # in CI) the hold bound; nothing else binds here.
    assert all(b"exceeded max_wait" in body for body in other), other
    assert {x.klass for x in named} == {"paced", "exempt"}, {x.klass for x in named}


def test_the_window_holds_two_proxies_on_one_data_dir(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    """robots.txt is on here: its fetches count in the window too (every request that leaves)."""
    shared = tmp_path / "shared"
    a = proxy_factory(upstream, SMALL + schedule(), data_dir=shared)
    b = proxy_factory(upstream, SMALL + schedule(), data_dir=shared)
    answers = load([a.env, b.env], 15.0, paced=3, exempt=4)
    assert_window_held(upstream, answers)


def test_the_window_holds_two_proxies_of_one_egress_on_redis(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer
) -> None:
    """Two data dirs, one Redis and one prefix, one egress name: one window."""
    prefix = f"pp-window-{uuid.uuid4().hex[:8]}:"
    top = schedule(f'backend = "redis"\nredis_url = "{redis_server.url}"\nredis_prefix = "{prefix}"\n')
    a = proxy_factory(upstream, SMALL + top)
    b = proxy_factory(upstream, SMALL + top)
    answers = load([a.env, b.env], 15.0, paced=3, exempt=4)
    assert_window_held(upstream, answers)
