"""Heartbeats kept beside the schedule (issue 27 item 2): memory, the data dir and a real redis-server.
Damaged or foreign records are ignored, never raise, never name a path; the count is bounded."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from politeproxy.policy.heartbeat import DROP_AFTER, MAX_PROXIES, live, make_beat
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.heartbeats import Beats, FileBeats, MemoryBeats, RedisBeats, beat_key
from politeproxy.stores.memory import MemoryStore
from tests.support.redis_server import RedisServer, redis_fixture

redis_one = redis_fixture("redis_one", scope="module")


@pytest.fixture(params=["memory", "file", "redis"])
async def beats(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Beats]:
    if request.param == "memory":
        yield MemoryBeats()
    elif request.param == "file":
        yield FileBeats(tmp_path)
    else:
        import redis.asyncio as aioredis

        server: RedisServer = request.getfixturevalue("redis_one")
        client = aioredis.from_url(server.url)
        try:
            yield RedisBeats(client, f"pp-beat-{uuid.uuid4().hex[:8]}:")
        finally:
            await client.aclose()


async def test_two_proxies_see_each_other_and_a_drop(beats: Beats) -> None:
    now = time.time()
    a, b = (make_beat(i, "127.0.0.1:1", "v", now, now, {"x": 2}) for i in ("a:1:1", "b:2:2"))
    await beats.put(a)
    await beats.put(b)
    seen = live(await beats.read(now), now)
    assert [x.id for x in seen] == ["a:1:1", "b:2:2"] and seen[0].pipelines == (("x", 2),)
    await beats.drop("b:2:2")
    assert [x.id for x in live(await beats.read(now), now)] == ["a:1:1"]


async def test_the_count_is_bounded(beats: Beats) -> None:
    now = time.time()
    for i in range(MAX_PROXIES + 6):
        await beats.put(make_beat(f"p{i:03d}", "l", "v", now, now, {}))
    assert len(live(await beats.read(now), now)) == MAX_PROXIES


async def test_file_records_damaged_foreign_and_stale(tmp_path: Path) -> None:
    fb = FileBeats(tmp_path)
    now = time.time()
    await fb.put(make_beat("ok:1:1", "l", "v", now, now, {}))
    d = tmp_path / "proxies"
    (d / f"{'0' * 32}.json").write_bytes(b"\xff{not json")  # damaged, fresh: ignored, kept
    (d / f"{'1' * 32}.json").write_bytes(b"[" * 100_000)  # too long: not read
    (d / "notes.txt").write_text("x")
    os.symlink("/etc/passwd", d / f"{'2' * 32}.json")
    stale = d / f"{'3' * 32}.json"
    stale.write_text('{"id": "old", "at": 1, "started": 1}')
    os.utime(stale, (now - DROP_AFTER - 5, now - DROP_AFTER - 5))
    got = await fb.read(now)
    assert [b.id for b in got] == ["ok:1:1"]
    assert not stale.exists() and (d / "notes.txt").exists() and (d / f"{'0' * 32}.json").exists()
    assert (d / f"{beat_key('ok:1:1')}.json").exists()


async def test_redis_age_comes_from_the_ttl(redis_one: RedisServer) -> None:
    """A writer whose clock is an hour behind is still live: the key's TTL says its age."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_one.url)
    rb = RedisBeats(client, f"pp-skew-{uuid.uuid4().hex[:8]}:")
    now = time.time()
    await rb.put(make_beat("skewed", "l", "v", now - 3600, now - 3600, {}))
    await client.set(f"{rb.prefix}beat:{'9' * 32}", b"garbage")
    await client.zadd(rb.index, {"9" * 32: now, "../x" * 100: now + 1, "*": now + 2})
    assert [b.id for b in live(await rb.read(now), now)] == ["skewed"]
    await client.aclose()


async def test_failover_multiplier_follows_the_live_count() -> None:
    fo = FailoverStore(MemoryStore(), MemoryStore(), gap_multiplier=2)
    assert fo.gap_multiplier == 2.0
    fo.note_live(5)
    assert fo.gap_multiplier == 5.0
    fo.note_live(1)
    assert fo.gap_multiplier == 2.0  # expected_proxies stays the floor
    fo.note_live(3)
    fo.degraded = True  # the count seen last while the primary answered is kept
    fo.note_live(1)
    assert fo.gap_multiplier == 3.0
