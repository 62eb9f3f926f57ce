"""Redis killed, frozen (SIGSTOP) and brought back under paced load, three proxies with expected_proxies = 4.

Each proxy has its own data dir, as on its own machine: Redis is all they share, and each falls back to its
own file store with the gap x4. Issue 9 items 6 (both switch-overs guarded, measured at the upstream) and 7
(a backoff recorded in Redis is still honoured by a proxy restarted while Redis is frozen).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.faults import (
    CC,
    DATA,
    INDEX,
    Checks,
    Load,
    arrivals_since,
    assert_budget,
    assert_clear,
    assert_no_request_during,
    health,
    paced_toml,
    prefixes,
    status_counts,
    throttle,
    throttled_arrival,
    wait_arrivals,
)
from tests.support.processes import wait_for
from tests.support.proxy_proc import ProxyProc
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.upstream_proc import Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.faults]

# The outage: the throttle while degraded is set 2 s in (every proxy is on its fallback within 1.3 s),
# and Redis returns at OUTAGE or 0.5 s after that throttled arrival, whichever is later.
OUTAGE = 3.5
# Recorded in Redis 1.5 s before the outage, so every proxy had time to see it (a claim refused for it, or a
# once-a-second read of the host's state) before Redis went; it spans the switch to the fallback.
RA_BEFORE = 4.0
SEEN = 1.5
RA_DURING = 3.0  # recorded in the fallback store while Redis is out; it spans the return to Redis


redis_server = redis_fixture()


def redis_toml(url: str) -> str:
    return paced_toml(f'backend = "redis"\nredis_url = "{url}"\nexpected_proxies = 4')


def mirrored_until(data_dir: Path, host: str) -> float:
    """backoff_until of ``host``'s record in the file store (ccrawl's layout: UnixNano at bytes 8-16), 0
    while there is none."""
    try:
        raw = (data_dir / "hosts" / host).read_bytes()
    except OSError:
        return 0.0
    return struct.unpack(">Q", raw[8:16])[0] / 1e9 if len(raw) >= 16 else 0.0


def all_degraded(proxies: list[ProxyProc], degraded: bool) -> bool:
    return all(health(p).get("degraded") is degraded for p in proxies)


def outage(redis: RedisServer, fault: str) -> None:
    (redis.kill if fault == "kill" else redis.pause)()


def recover(redis: RedisServer, fault: str) -> None:
    (redis.restart if fault == "kill" else redis.resume)()


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_three_proxies_keep_the_budget_across_a_redis_outage(
    proxy_factory: Callable[..., ProxyProc],
    upstream: Upstream,
    redis_server: RedisServer,
    tmp_path: Path,
    fault: str,
) -> None:
    proxies = [proxy_factory(upstream, redis_toml(redis_server.url)) for _ in range(3)]
    upstream.reset()
    t_start = time.time()
    # Every proxy loads data.commoncrawl.org and commoncrawl.org; only p0 sends to index.commoncrawl.org,
    # so a throttle there during the outage is known to the one proxy that must honour it.
    hosts = [(DATA, CC, INDEX), (DATA, CC), (DATA, CC)]
    loads = [prefixes(f"p{i}", *h) for i, h in enumerate(hosts)]
    load = Load.start(tmp_path, [p.env for p in proxies], loads)
    try:
        wait_arrivals(upstream, 10, t_start)
        t_before = throttled_arrival(upstream, DATA, throttle(upstream, DATA, f"{RA_BEFORE:g}"))
        time.sleep(SEEN)
        down = time.time()
        outage(redis_server, fault)
        wait_for(lambda: all_degraded(proxies, True), 15, "every proxy on its fallback store")
        degraded_seen = time.time()
        wait_for(lambda: time.time() >= down + OUTAGE - 1.5, 30, "the outage")
        t_during = throttled_arrival(upstream, INDEX, throttle(upstream, INDEX, f"{RA_DURING:g}"))
        wait_for(lambda: time.time() >= max(down + OUTAGE, t_during + 0.5), 30, "the outage")
        up_again = time.time()
        recover(redis_server, fault)
        wait_for(lambda: all_degraded(proxies, False), 15, "every proxy back on Redis")
        back = time.time()
        # Past the 2.5 s grace after the return; the load drains at the full rate for ~2 s after finish().
        time.sleep(3.0)
        rs = load.finish()
    finally:
        load.kill()
    arrivals = arrivals_since(upstream, t_start)
    marks = {fault: down, "recover": up_again, "all back": back}
    check = Checks()
    most = check(assert_budget, arrivals, marks)
    check(assert_no_request_during, arrivals, DATA, t_before, RA_BEFORE, "a Retry-After recorded in Redis")
    check(
        assert_no_request_during,
        arrivals,
        INDEX,
        t_during,
        RA_DURING,
        "a Retry-After recorded while degraded",
    )
    check(assert_clear, rs)
    check.that(
        status_counts(rs)[503] == 2, f"only the two throttled requests may be 503: {status_counts(rs)}"
    )
    # Loosely: pacing went on while Redis was out, and resumed on Redis afterwards.
    during = [a for a in arrivals if degraded_seen < a["t"] < up_again]
    after = [a for a in arrivals if a["t"] > back]
    check.that(len(during) >= 3 and len(after) >= 10, f"{len(during)} degraded, {len(after)} after")
    check.that(all(health(p).get("store") == "redis" for p in proxies), "not every proxy is back on Redis")
    print(f"\nredis {fault}: {len(arrivals)} arrivals, busiest 1 s {most}, degraded {len(during)}")
    check.done()


def test_restart_while_redis_is_frozen_honours_a_backoff_recorded_in_redis(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Issue 9 item 7, with shorter numbers: Retry-After 14, the restart ~3 s later (at least 5 s of the
    backoff left, asserted).

    Issue 42, item 11: it failed about 1 run in 3. The restart (a kill, a new process, a 1 s ping of the
    frozen Redis) takes ~3 s on a busy box, against 5 s of room with a Retry-After of 10; and a fixed 0.5 s
    stood in for the mirror's write into the data dir, which the killed proxy may not have made yet. Now
    the Retry-After leaves 9 s of room, and the kill waits until the mirror is on disk."""
    retry_after = 14.0
    data_dir = tmp_path / "own"
    toml = redis_toml(redis_server.url)
    a = proxy_factory(upstream, toml, data_dir=data_dir)
    upstream.reset()
    t_start = time.time()
    load = Load.start(tmp_path, [a.env], [prefixes("a", DATA)], concurrency=1)
    try:
        t503 = throttled_arrival(upstream, DATA, throttle(upstream, DATA, f"{retry_after:g}"))
        # Recorded in Redis and mirrored into the data dir's file store (the fallback a restart reads)
        wait_for(lambda: mirrored_until(data_dir, DATA) > t503 + retry_after - 2, 10, "the mirrored backoff")
        redis_server.pause()
        a.kill()
        load.kill()
        a2 = proxy_factory(upstream, toml, data_dir=data_dir, port=a.port)
        restarted = time.time()
        assert restarted < t503 + retry_after - 5, "the restart took too long; the test proves nothing"
        # One request to the throttled host and one to another: the first must wait out the Retry-After
        # (or be refused with a Retry-After of its own), the second shows the proxy paces on its fallback.
        load = Load.start(tmp_path, [a2.env, a2.env], [prefixes("after", DATA), prefixes("other", CC)], 1)
        wait_for(lambda: time.time() > t503 + retry_after + 1.0, 30, "the end of the Retry-After")
        rs = load.finish()
    finally:
        load.kill()
    arrivals = arrivals_since(upstream, t_start)
    check = Checks()
    check(assert_budget, arrivals, {"503": t503, "restart": restarted})
    check(assert_no_request_during, arrivals, DATA, t503, retry_after, "a Retry-After recorded in Redis")
    check(assert_clear, rs)
    check.that(any("/load/other-" in a["path"] for a in arrivals), "the restarted proxy sent nothing at all")
    check.that(health(a2).get("degraded") is True, f"not degraded with Redis frozen: {health(a2)}")
    check.done()
