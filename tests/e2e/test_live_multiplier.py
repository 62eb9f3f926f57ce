"""The degraded-mode gap multiplier from the live count (issue 27 item 2): three proxies beat on one Redis
server; when it dies, the one under test paces locally at gap x 3 (the live count last seen), though
``expected_proxies`` is 1; the beats that fail meanwhile leave the count alone."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import redis.asyncio as aioredis

from politeproxy.observe.announce import Announcer
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.heartbeats import RedisBeats
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, redis_fixture

HOST = "data.commoncrawl.org"
own_redis = redis_fixture("own_redis", scope="function")  # this test kills it


class _Pacer:
    def snapshot(self) -> Any:
        return SimpleNamespace(weights={}, queued_by_pipeline={"x": 1})


async def test_the_failover_gap_follows_the_live_count(own_redis: RedisServer) -> None:
    primary = RedisStore(own_redis.url, prefix="pp-live:", socket_timeout=0.5)
    fs = FailoverStore(primary, MemoryStore(), gap_multiplier=1, probe_interval=60.0)
    client = aioredis.from_url(own_redis.url, socket_timeout=0.5)
    pacer: Any = _Pacer()
    mine = Announcer(RedisBeats(client, "pp-live:"), pacer, "127.0.0.1:1", fs.note_live, ident="me")
    others = [Announcer(RedisBeats(client, "pp-live:"), pacer, "x", ident=f"o{i}") for i in (1, 2)]
    try:
        for a in [*others, mine]:
            await a.beat()
        assert fs.gap_multiplier == 3.0 and [r["id"] for r in mine.rows()] == ["me", "o1", "o2"]
        assert (await fs.claim(HOST, 0.05, 0.0, None)).granted
        own_redis.kill()
        held = await fs.claim(HOST, 0.05, 0.0, None)  # fails over; holds a widened gap after the last slot
        assert fs.degraded
        await mine.beat()  # cannot reach the store: the count seen last stays
        assert fs.gap_multiplier == 3.0
        await asyncio.sleep(held.wait)
        local = [await fs.claim(HOST, 0.05, 0.0, None) for _ in range(3)]
        assert all(c.granted for c in local)
        # Reserved slots, not wall time: exactly three gaps apart (no timing jitter involved).
        assert [round(b.at - a.at, 6) for a, b in zip(local, local[1:], strict=False)] == [0.15] * 2
    finally:
        await client.aclose()
        await fs.close()
