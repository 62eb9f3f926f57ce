"""RedisStore when its server dies, hangs or asks for a password, and the failover store that paces
locally meanwhile and returns to Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.slots import Outcome
from politeproxy.stores.base import StoreError
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, redis_fixture

HOST = "data.commoncrawl.org"

# One server for the module (fast); the outage tests take their own so killing it harms no one else.
own_redis = redis_fixture("own_redis", scope="function")


async def test_store_error_is_quick_when_the_server_dies(own_redis: RedisServer) -> None:
    s = RedisStore(own_redis.url, prefix="pp-kill:")
    try:
        assert (await s.claim(HOST, 0.01, 0.0, None)).granted
        own_redis.kill()
        calls: list[Any] = [
            lambda: s.claim(HOST, 0.01, 0.0, None),
            lambda: s.throttled(HOST, 1.0, BackoffPolicy()),
            lambda: s.succeeded(HOST),
            lambda: s.set_crawl_delay(HOST, 1.0, 60.0),
            lambda: s.host_view(HOST),
            lambda: s.grants(),
        ]
        for call in calls:
            t0 = time.monotonic()
            with pytest.raises(StoreError):
                await call()
            assert time.monotonic() - t0 < 3.0
    finally:
        await s.close()


async def test_store_error_is_bounded_when_the_server_hangs(own_redis: RedisServer) -> None:
    s = RedisStore(own_redis.url, prefix="pp-hang:", socket_timeout=0.3)
    try:
        assert (await s.claim(HOST, 0.01, 0.0, None)).granted
        own_redis.pause()  # connections stay open but nothing answers
        t0 = time.monotonic()
        with pytest.raises(StoreError):
            await s.claim(HOST, 0.01, 0.0, None)
        assert time.monotonic() - t0 < 1.5
    finally:
        own_redis.resume()
        await s.close()


async def test_password_in_the_url(own_redis: RedisServer) -> None:
    admin = aioredis.from_url(own_redis.url)
    await admin.config_set("requirepass", "s3cret")
    await admin.aclose()
    good = RedisStore(f"redis://:s3cret@127.0.0.1:{own_redis.port}/0", prefix="pp-auth:")
    bad = RedisStore(f"redis://:wrong@127.0.0.1:{own_redis.port}/0", prefix="pp-auth:")
    try:
        assert (await good.claim(HOST, 0.01, 0.0, None)).granted
        with pytest.raises(StoreError):  # a wrong password fails over like an outage, it does not crash
            await bad.claim(HOST, 0.01, 0.0, None)
    finally:
        await good.close()
        await bad.close()


async def test_failover_paces_locally_then_returns_to_redis(own_redis: RedisServer) -> None:
    primary = RedisStore(own_redis.url, prefix="pp-failover:", socket_timeout=0.5)
    fs = FailoverStore(primary, MemoryStore(), gap_multiplier=3, probe_interval=0.1)
    try:
        for _ in range(3):
            assert (await fs.claim(HOST, 0.05, 0.0, None)).granted
        assert fs.name == "redis" and await primary.grants() == 3

        own_redis.kill()
        t0 = time.monotonic()
        # The first local grant waits one widened gap after the last shared slot: the three claims above
        # reserved slots up to 0.1 s ahead, so the hold runs to about 0.1 + 0.15 s from the switch.
        held = await fs.claim(HOST, 0.05, 0.0, None)
        assert time.monotonic() - t0 < 3.0
        assert fs.degraded and fs.name == "memory"
        assert held.outcome is Outcome.HOST_NOT_READY and 0.15 < held.wait <= 0.25
        await asyncio.sleep(held.wait)
        local = [await fs.claim(HOST, 0.05, 0.0, None) for _ in range(4)]
        assert all(c.granted for c in local)
        # Pacing alone, the proxy keeps three times the gap so N proxies together stay in the budget.
        assert [round(b.at - a.at, 6) for a, b in zip(local, local[1:], strict=False)] == [0.15] * 3

        own_redis.restart()
        deadline = time.monotonic() + 5.0
        while fs.degraded and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not fs.degraded and fs.name == "redis"
        # The local slots above run up to 0.45 s ahead: the first shared grant waits a widened gap after them.
        back = await fs.claim(HOST, 0.05, 0.0, None)
        if not back.granted:
            assert back.outcome is Outcome.HOST_NOT_READY and back.wait <= 0.45 + 0.15
            await asyncio.sleep(back.wait)
            back = await fs.claim(HOST, 0.05, 0.0, None)
        assert back.granted
        assert await primary.grants() == 1  # the restarted server (no persistence) counts afresh
    finally:
        await fs.close()
