"""Many machines, one budget: proxies sharing a real redis-server (issue 4's acceptance tests).

Each proxy gets its own data dir, as it would on its own machine, so Redis is the only thing they share.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.measure import (
    achieved_rate,
    budget_bound,
    busiest_window,
    over_budget,
    results,
    run_clients,
)
from tests.support.pacing_clients import start_clients, warm_upstream_pool
from tests.support.processes import wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.upstream_proc import Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow

GAP = 0.02  # 50 req/s


redis_server = redis_fixture()
# The three proxies run against the system redis-server only (Redis 7). Redis 6.2 and Valkey run the same
# sharing a level down, with real processes claiming from one server of each kind
# (tests/e2e/test_redis_processes.py, and the store contract in tests/unit/stores/ and
# tests/e2e/test_redis_store.py); here each kind repeated ~10-30 s of three proxies and 30 clients
# (until 2026-12-07).


LATE = 0.06  # seconds of late grants the rate tests tolerate (see their comments)
STALL = 0.2  # seconds of held-back grants the busiest second of the healthy test tolerates (see there)


def redis_toml(url: str, gap: str = "20ms", expected: int = 1, extra: str = "") -> str:
    return (
        NO_ROBOTS
        + f'[schedule]\nbackend = "redis"\nredis_url = "{url}"\nglobal_rate = "{gap}"\n'
        + f"expected_proxies = {expected}\n"
        + extra
    )


def paced_arrivals(up: Upstream, tag: str) -> list[float]:
    return [a["t"] for a in up.log() if a["host"] == "data.commoncrawl.org" and tag in a["path"]]


def start_proxies(
    factory: Callable[..., ProxyProc],
    up: Upstream,
    n: int,
    toml: str,
    envs: list[dict[str, str]] | None = None,
) -> list[ProxyProc]:
    return [factory(up, toml, env=(envs[i] if envs else None)) for i in range(n)]


def test_three_proxies_share_one_budget(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    proxies = start_proxies(proxy_factory, upstream, 3, redis_toml(redis_server.url))
    for p in proxies:
        warm_upstream_pool(p.env)  # exempt reads: no slot, but the upstream TLS handshakes are paid
    upstream.reset()
    # Every client holds its tunnels open and fires on one signal, so the queues never drain.
    run = start_clients([p.env for p in proxies], "data.commoncrawl.org", 40, 10, "/share/x", tmp_path)
    run.fire()
    outs = run.results()
    assert all(r["status"] == 200 for out in outs for r in out), outs
    times = paced_arrivals(upstream, "/share/")
    assert len(times) == 120
    # Jitter tolerated: grants up to LATE s late (three slots at 50/s; a loaded 2-core box runs three proxies,
    # 30 clients and Redis). The upper bound is the budget rule; the lower one is loose (slower is polite).
    # Three proxies each keeping its own 50/s would put ~150 in a second: the bound (54) still proves it.
    rate = achieved_rate(times)
    gaps = len(times) - 1  # the first arrival may be up to LATE late: the span shrinks by that much
    assert rate <= gaps / (gaps * GAP - LATE), f"combined rate {rate:.2f}/s"
    assert rate >= 50.0 * 0.6, f"combined rate {rate:.2f}/s"  # 0.67 was seen beside a CPU burner
    # The busiest second tolerates more: a stall of the loaded box (one process, or the upstream's recorder)
    # releases the slots it held back together. Seen once in seven full-suite runs: 59 in one second, ~8
    # slots bunched. 0.2 s of late grants (10 slots) gives a bound of 61, still far from the ~150 of three
    # budgets; the whole run's rate above keeps the strict LATE.
    over = over_budget(times, 50.0, window=1.0, late=STALL)
    assert over is None, over
    for p in proxies:
        assert json.loads(p.get("/healthz"))["store"] == "redis"


def test_retry_after_seen_by_one_proxy_holds_the_others(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer
) -> None:
    toml = redis_toml(redis_server.url, extra="[pacing]\nretries = 0\n")
    a, b = start_proxies(proxy_factory, upstream, 2, toml)
    upstream.reset()
    upstream.control(
        {"throttle": {"host": "data.commoncrawl.org", "count": 1, "status": 503, "retry_after": "2"}}
    )
    ra = results(run_clients(a.env, "https://data.commoncrawl.org/ra/a-", 1, 1))
    assert ra[0]["status"] == 503 and ra[0]["retry_after"] == "2"
    rb = results(run_clients(b.env, "https://data.commoncrawl.org/ra/b-", 1, 1))
    assert rb[0]["status"] == 200
    log = [e for e in upstream.log() if "/ra/" in e["path"]]
    throttled_at = next(e["t"] for e in log if "/ra/a-" in e["path"])
    b_at = next(e["t"] for e in log if "/ra/b-" in e["path"])
    assert b_at - throttled_at >= 2.0 - 0.05, f"proxy B went {b_at - throttled_at:.3f}s after the 503"


def test_redis_outage_keeps_pacing_and_recovers(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer
) -> None:
    # expected_proxies one above the real count, as the README advises, leaves room for the switch-overs.
    proxies = start_proxies(proxy_factory, upstream, 3, redis_toml(redis_server.url, expected=4))
    upstream.reset()
    # 300 at 50/s is 6 s with Redis, longer while degraded. The restart comes at least 3 s in (1 s, then 2 s
    # degraded), by when at most 150 can have been granted: the load always runs on well past the return.
    n_each = 100
    clients = [
        run_clients(p.env, f"https://data.commoncrawl.org/outage/p{i}-", n_each, 8)
        for i, p in enumerate(proxies)
    ]
    time.sleep(1.0)  # 50 grants on the shared schedule before the kill
    killed = time.time()
    redis_server.kill()
    wait_for(lambda: all(json.loads(p.get("/healthz"))["degraded"] for p in proxies), 15, "degraded")
    assert all("politeproxy_schedule_degraded 1.0" in p.metrics() for p in proxies)
    time.sleep(2.0)
    restarted = time.time()
    redis_server.restart()
    wait_for(lambda: not any(json.loads(p.get("/healthz"))["degraded"] for p in proxies), 15, "back on redis")
    outs = [results(c, timeout=180) for c in clients]
    statuses = [r["status"] for out in outs for r in out]
    assert statuses.count(200) == 3 * n_each, {s: statuses.count(s) for s in set(statuses)}
    times = paced_arrivals(upstream, "/outage/")
    assert len(times) == 3 * n_each  # nothing lost, nothing sent twice
    start, count = busiest_window(times)
    per = {
        f"p{i}": sum(
            1 for a in upstream.log() if f"/outage/p{i}-" in a["path"] and start <= a["t"] < start + 1
        )
        for i in range(3)
    }
    # The budget rule (tests/support/measure.py), as the healthy test holds it: the whole run's rate with the
    # strict LATE, the busiest second with STALL (a stall of the loaded box releases the slots it held back
    # together: 55 in one second, 4.5 s after the restart, in one clean-clone run). Proxies that each kept
    # 50/s while degraded would put ~150 in one second, so the bound (61) still proves one budget across it.
    rate, gaps = achieved_rate(times), len(times) - 1
    assert rate <= gaps / (gaps * GAP - LATE), f"combined rate {rate:.2f}/s"
    bound = budget_bound(50.0, 1.0, STALL)
    assert count <= bound, (
        f"{count} > {bound} in the 1 s from {start - killed:+.2f}s of the kill, "
        f"{start - restarted:+.2f}s of the restart; per proxy {per}"
    )
    for p in proxies:
        assert (
            "degraded" not in json.loads(p.get("/healthz")) or not json.loads(p.get("/healthz"))["degraded"]
        )
        assert "pacing on" in p.log()  # the warning said what it did


SKEW = {"POLITEPROXY_CLOCK_OFFSET": "5"}


def _skewed_pair_arrivals(
    a: ProxyProc, b: ProxyProc, upstream: Upstream, tmp_path: Path, n: int = 50
) -> tuple[list[float], list[float]]:
    """Fire ``n`` paced requests through each of two proxies at once; the arrivals of each at the upstream."""
    for p in (a, b):
        warm_upstream_pool(p.env)
    upstream.reset()
    runs = [
        start_clients([p.env], "data.commoncrawl.org", n, 10, f"/skew-{tag}/x", tmp_path)
        for p, tag in ((a, "a"), (b, "b"))
    ]
    for r in runs:
        r.fire()
    for r in runs:
        assert all(x["status"] == 200 for out in r.results() for x in out)
    return paced_arrivals(upstream, "/skew-a/"), paced_arrivals(upstream, "/skew-b/")


def _first_second_share(ta: list[float], tb: list[float], t0: float | None = None) -> float:
    """The share of proxy a among the arrivals of the second from ``t0`` (the first arrival by default)."""
    t0 = min(ta + tb) if t0 is None else t0
    in_a = sum(1 for t in ta if t0 <= t < t0 + 1.0)
    return in_a / max(1, in_a + sum(1 for t in tb if t0 <= t < t0 + 1.0))


def test_clock_skew_splits_a_schedule_kept_on_local_clocks(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    """The control: the offset really moves the clock a store could use. Two proxies on one file store
    (which keeps local wall-clock times) with clocks 5 s apart do not share turns: the one behind waits
    for the slot the one ahead wrote, about 5 s in its future. The Redis test below must not show this."""
    shared = tmp_path / "shared"
    toml = NO_ROBOTS + '[schedule]\nbackend = "file"\nglobal_rate = "20ms"\n'
    a = proxy_factory(upstream, toml, data_dir=shared)
    b = proxy_factory(upstream, toml, data_dir=shared, env=SKEW)
    ta, tb = _skewed_pair_arrivals(a, b, upstream, tmp_path)
    # Counted from b's first arrival: once b has written a slot 5 s ahead of a's clock, a waits. Before it,
    # a runs alone (b's clients may start a few slots later on a loaded box: 100 ms once in CI, 7 of 51).
    share = _first_second_share(ta, tb, min(tb))
    assert share <= 0.1, "the skew did not hold back the proxy whose clock is behind"


def test_clock_skew_does_not_split_the_schedule(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    """With Redis the claim reads the server's clock, so a proxy whose clock runs 5 s ahead takes turns
    with the other from the first second, and together they stay within the one budget."""
    a, b = start_proxies(proxy_factory, upstream, 2, redis_toml(redis_server.url), envs=[{}, SKEW])
    ta, tb = _skewed_pair_arrivals(a, b, upstream, tmp_path)
    times = sorted(ta + tb)
    assert len(times) == 100
    share_a = _first_second_share(ta, tb)
    assert 0.25 <= share_a <= 0.75, f"proxy a took {share_a:.0%} of the first second's grants"
    over = over_budget(times, 50.0, window=1.0, late=LATE)  # the budget rule, as above
    assert over is None, over
    assert achieved_rate(times) >= 50.0 * 0.8  # the lower bound loosely: slower is polite
