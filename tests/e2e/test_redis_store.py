"""RedisStore against a real redis-server: the claim semantics, shared backoff, keys, TTLs and scripts.
Outages: test_redis_outages.py; many processes on one schedule: test_redis_processes.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.slots import Outcome
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer

HOST = "data.commoncrawl.org"
OTHER = "index.commoncrawl.org"


@pytest.fixture
async def raw(shared_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(shared_redis.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def store(shared_redis: RedisServer, prefix: str) -> AsyncIterator[RedisStore]:
    s = RedisStore(shared_redis.url, prefix=prefix, rand=lambda: 0.0)
    yield s
    await s.close()


@pytest.fixture
async def peer(shared_redis: RedisServer, prefix: str) -> AsyncIterator[RedisStore]:
    """A second instance on the same prefix: another proxy sharing the budget."""
    s = RedisStore(shared_redis.url, prefix=prefix, rand=lambda: 0.0)
    yield s
    await s.close()


# -- the claim ------------------------------------------------------------------------------------------


async def test_claims_are_gap_apart_and_counted(store: RedisStore) -> None:
    slots = []
    began = time.monotonic()
    for _ in range(5):
        c, at = await store.claim_with_server_time(HOST, 0.05, 0.0, None)
        assert c.granted
        slots.append(at)
    # The server schedule is exact: each slot is the previous one plus the gap, to the microsecond.
    assert [round(b - a, 6) for a, b in zip(slots, slots[1:], strict=False)] == [0.05] * 4
    assert await store.grants() == 5
    last = await store.claim(HOST, 0.05, 0.0, None)
    # The sixth slot is 0.25 s after the first; the wait is that less the time these claims took (a loaded
    # box once took 80 ms), never more.
    took = time.monotonic() - began
    assert 0.25 - took - 0.01 <= last.wait <= 0.25 + 0.01, (last.wait, took)
    # ``at`` is in the local clock: now + wait, read right after the call. The margin is a busy loop's
    # delay between the answer and this line (a burner beside the suite); a server-clock ``at`` would be
    # off by the whole clock difference, which the skew tests (tests/slow/test_redis_cluster.py) cover.
    assert abs(last.at - (time.time() + last.wait)) < 0.25


async def test_gap_zero_counts_but_does_not_schedule(store: RedisStore, raw: aioredis.Redis) -> None:
    for _ in range(3):
        c = await store.claim(HOST, 0.0, 0.0, None)
        assert c.granted and c.wait == 0.0
    assert await store.grants() == 3
    assert await raw.hget(store.global_key, "next") is None


async def test_host_not_ready_reserves_nothing(store: RedisStore) -> None:
    first, at1 = await store.claim_with_server_time(HOST, 0.5, 10.0, None)
    assert first.granted
    blocked = await store.claim(HOST, 0.5, 10.0, None)
    assert blocked.outcome is Outcome.HOST_NOT_READY
    assert 9.5 < blocked.wait <= 10.0
    assert await store.grants() == 1
    # The global slot after the first is still free: the refused claim did not take it.
    other, at2 = await store.claim_with_server_time(OTHER, 0.5, 10.0, None)
    assert other.granted
    assert round(at2 - at1, 6) == 0.5
    view = await store.host_view(HOST)
    assert 9.0 < view.ready_in <= 10.0 and view.backoff_in == 0.0


async def test_too_late_reserves_nothing(store: RedisStore) -> None:
    _, at1 = await store.claim_with_server_time(HOST, 1.0, 0.0, None)
    late = await store.claim(OTHER, 1.0, 0.0, 0.5)  # its slot is ~1 s away, beyond max_wait
    assert late.outcome is Outcome.TOO_LATE
    assert 0.5 < late.wait <= 1.0
    assert await store.grants() == 1
    c, at2 = await store.claim_with_server_time(OTHER, 1.0, 0.0, None)
    assert c.granted and round(at2 - at1, 6) == 1.0  # the slot nobody took is the next one

    # A host that is not ready until after max_wait is too late as well, not merely not ready.
    await store.claim(HOST, 0.0, 30.0, None)
    assert (await store.claim(HOST, 0.0, 30.0, 5.0)).outcome is Outcome.TOO_LATE
    assert (await store.claim(HOST, 0.0, 30.0, 60.0)).outcome is Outcome.HOST_NOT_READY


async def test_crawl_delay_raises_the_host_step(store: RedisStore) -> None:
    await store.set_crawl_delay(HOST, 5.0, ttl=60.0)
    view = await store.host_view(HOST)
    assert view.crawl_delay == 5.0 and view.robots_fresh
    assert (await store.claim(HOST, 0.0, 1.0, None)).granted
    again = await store.claim(HOST, 0.0, 1.0, None)
    assert again.outcome is Outcome.HOST_NOT_READY and 4.5 < again.wait <= 5.0
    # An interval longer than the crawl-delay wins.
    await store.set_crawl_delay(OTHER, 0.5, ttl=0.0)
    assert not (await store.host_view(OTHER)).robots_fresh
    assert (await store.claim(OTHER, 0.0, 2.0, None)).granted
    assert 1.5 < (await store.claim(OTHER, 0.0, 2.0, None)).wait <= 2.0


async def test_a_global_next_far_ahead_is_treated_as_now(store: RedisStore, raw: aioredis.Redis) -> None:
    # Only a server clock that jumped back leaves a slot hours ahead; waiting it out would stall everyone.
    seconds, micros = await raw.time()
    await raw.hset(store.global_key, mapping={"next": (seconds + 7200) * 1_000_000 + micros, "count": 0})
    first = await store.claim(HOST, 0.05, 0.0, None)
    assert first.granted and first.wait <= 0.05  # treated as now + one gap
    assert 0.0 < (await store.claim(HOST, 0.05, 0.0, None)).wait <= 0.1


# -- backoff ----------------------------------------------------------------------------------------------


async def test_retry_after_is_seen_by_another_proxy(store: RedisStore, peer: RedisStore) -> None:
    policy = BackoffPolicy(base=1.0, factor=2.0, cap=300.0, jitter=0.2)
    delay = await store.throttled(HOST, 2.0, policy)
    assert delay.seconds == 2.0 and delay.capped_from is None
    view = await peer.host_view(HOST)
    assert 1.5 < view.backoff_in <= 2.0 and view.throttles == 1
    c = await peer.claim(HOST, 0.0, 0.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and 1.5 < c.wait <= 2.0
    assert (await peer.claim(OTHER, 0.0, 0.0, None)).granted  # a host in backoff holds no other host

    capped = await peer.throttled(HOST, 1000.0, policy)
    assert capped.seconds == 300.0 and capped.capped_from == 1000.0


async def test_backoff_grows_across_proxies_and_success_resets(store: RedisStore, peer: RedisStore) -> None:
    policy = BackoffPolicy(base=1.0, factor=2.0, cap=300.0, jitter=0.2)
    delays = [
        (await store.throttled(HOST, None, policy)).seconds,
        (await peer.throttled(HOST, None, policy)).seconds,
        (await store.throttled(HOST, None, policy)).seconds,
    ]
    assert delays == [1.0, 2.0, 4.0]  # rand is 0, so no jitter: the count is shared
    view = await peer.host_view(HOST)
    assert view.throttles == 3 and 3.5 < view.backoff_in <= 4.0

    await peer.succeeded(HOST)
    view = await store.host_view(HOST)
    assert view.throttles == 0
    assert view.backoff_in > 3.5  # success resets the count, not the backoff already promised
    assert (await store.throttled(HOST, None, policy)).seconds == 1.0


async def test_jitter_comes_from_rand(shared_redis: RedisServer, prefix: str) -> None:
    s = RedisStore(shared_redis.url, prefix=prefix, rand=lambda: 0.5)
    try:
        policy = BackoffPolicy(base=10.0, factor=2.0, cap=300.0, jitter=0.2)
        assert (await s.throttled(HOST, None, policy)).seconds == pytest.approx(11.0)
    finally:
        await s.close()


async def test_succeeded_on_unknown_host_creates_nothing(store: RedisStore, raw: aioredis.Redis) -> None:
    await store.succeeded(HOST)
    assert await raw.exists(store.host_key(HOST)) == 0


async def test_absurd_backoff_is_treated_as_now(store: RedisStore, raw: aioredis.Redis) -> None:
    # A backoff_until beyond twice the cap can only come from a clock jump; it must not stall the host.
    seconds, micros = await raw.time()
    far = (seconds + 100_000) * 1_000_000 + micros
    await raw.hset(store.host_key(HOST), mapping={"backoff_until": far, "throttles": 0})
    policy = BackoffPolicy(base=1.0, factor=2.0, cap=30.0, jitter=0.0)
    assert (await store.throttled(HOST, None, policy)).seconds == 1.0
    assert 0.5 < (await store.host_view(HOST)).backoff_in <= 1.0


# -- keys, TTLs, scripts -----------------------------------------------------------------------------------


async def test_keys_use_the_prefix_and_carry_ttls(shared_redis: RedisServer, raw: aioredis.Redis) -> None:
    p = f"pp-ttl-{uuid.uuid4().hex[:8]}:"
    s = RedisStore(shared_redis.url, prefix=p, key_ttl=60.0)
    try:
        await s.claim(HOST, 0.01, 1.0, None)
        await s.throttled(OTHER, 5.0, BackoffPolicy(adaptive=False))
        assert sorted(await raw.keys(f"{p}*")) == sorted(
            [f"{p}global", f"{p}host:{HOST}", f"{p}host:{OTHER}"]
        )
        for key in await raw.keys(f"{p}*"):
            assert 55_000 < await raw.pttl(key) <= 66_000, key
        # The adaptive interval steps back for adaptive_recovery after the backoff: the key lives that long.
        await s.throttled(OTHER, 5.0, BackoffPolicy(adaptive_recovery=600.0))
        assert await raw.pttl(f"{p}host:{OTHER}") > 600_000
        # State still in force outlives key_ttl: a long interval keeps its host key alive that long.
        await s.claim("commoncrawl.org", 0.0, 600.0, None)
        assert await raw.pttl(f"{p}host:commoncrawl.org") > 600_000
        await s.set_crawl_delay("s3.amazonaws.com", 1.0, ttl=3600.0)
        assert await raw.pttl(f"{p}host:s3.amazonaws.com") > 3_600_000
    finally:
        await s.close()


async def test_two_prefixes_are_two_budgets(shared_redis: RedisServer) -> None:
    a = RedisStore(shared_redis.url, prefix=f"pp-a-{uuid.uuid4().hex[:8]}:")
    b = RedisStore(shared_redis.url, prefix=f"pp-b-{uuid.uuid4().hex[:8]}:")
    try:
        assert (await a.claim(HOST, 1.0, 0.0, None)).wait < 0.1
        assert (await b.claim(HOST, 1.0, 0.0, None)).wait < 0.1
        assert (await a.claim(HOST, 1.0, 0.0, None)).wait > 0.9  # the same prefix shares the schedule
        assert await a.grants() == 2 and await b.grants() == 1
    finally:
        await a.close()
        await b.close()


async def test_recovers_after_script_flush(store: RedisStore, raw: aioredis.Redis) -> None:
    policy = BackoffPolicy()
    await store.claim(HOST, 0.01, 0.0, None)
    await store.throttled(OTHER, 1.0, policy)
    await raw.script_flush()
    # Every script is reloaded on NOSCRIPT; nothing reaches the caller.
    assert (await store.claim(HOST, 0.01, 0.0, None)).granted
    await store.throttled(OTHER, 1.0, policy)
    await store.succeeded(OTHER)
    await store.set_crawl_delay(HOST, 1.0, 60.0)
    assert (await store.host_view(HOST)).crawl_delay == 1.0
    assert await store.grants() == 2
