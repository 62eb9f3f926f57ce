"""The Redis Lua scripts against what no row of the claim-case table can express: a cancellation between
round trips, stray values from HSET, a record corrupted between two claims of a running proxy."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.stores.redis_store import RedisStore
from tests.support.claim_table import HOST
from tests.support.redis_server import RedisServer


@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[RedisStore]:
    s = RedisStore(server.url, prefix=f"pp-cases-{uuid.uuid4().hex[:8]}:", rand=lambda: 0.0)
    yield s
    await s.close()


async def test_a_global_record_corrupted_mid_run_never_repeats_a_slot(
    store: RedisStore, raw: aioredis.Redis
) -> None:
    """A stray HSET of the global next mid-run: the next grant follows the ones this proxy made."""
    await store.claim(HOST, 0.1, 0.0, None)
    await store.claim(HOST, 0.1, 0.0, None)  # its slot is ~0.1 s ahead, next ~0.2 s
    await raw.hset(store.global_key, "next", "1e30")
    c = await store.claim(HOST, 0.1, 0.0, None)
    assert c.granted and c.wait >= 0.2 - 0.02


async def test_a_throttle_cannot_be_cut_in_half(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client leaves right after the first round trip of throttled() (item 5). With two scripts the
    throttle was counted but its backoff never applied; with one, the count and the backoff go together."""
    real = store._script

    async def cancelled_after_first(*args: Any) -> Any:
        await real(*args)
        raise asyncio.CancelledError  # the handler is cancelled as the answer arrives

    monkeypatch.setattr(store, "_script", cancelled_after_first)
    with pytest.raises(asyncio.CancelledError):
        await store.throttled(HOST, 5.0, BackoffPolicy(cap=300.0))
    monkeypatch.setattr(store, "_script", real)
    view = await store.host_view(HOST)
    assert view.throttles == 1 and 4.5 < view.backoff_in <= 5.0


@pytest.mark.parametrize(
    "fields",
    [
        {"backoff_until": "1e400", "next_allowed": "nan", "throttles": "abc", "crawl_delay": "-inf"},
        {"backoff_until": "BIG", "next_allowed": "BIG", "robots_expires": "BIG", "crawl_delay": "1e15"},
    ],
)
async def test_stray_host_fields_are_treated_as_now(
    store: RedisStore, raw: aioredis.Redis, fields: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A host hash written by anyone (two HSETs through an open proxy, item 11/12): values that are not
    numbers, or a backoff a billion seconds ahead, are treated as now, logged once, and never raise (a
    stray value used to break PEXPIRE too); the record is rewritten sane."""
    seconds, _ = await raw.time()
    big = f"{(seconds + 1_000_000_000) * 1_000_000:.0f}"
    await raw.hset(store.host_key(HOST), mapping={k: big if v == "BIG" else v for k, v in fields.items()})
    for _ in range(3):
        c = await store.claim(HOST, 0.01, 0.0, 1.0)
        assert c.granted and c.wait <= 0.011
        view = await store.host_view(HOST)
        assert view.backoff_in == 0.0 and view.crawl_delay == 0.0 and not view.robots_fresh
        await asyncio.sleep(0.011)
    assert (await store.throttled(HOST, None, BackoffPolicy(cap=30.0, jitter=0.0))).seconds == 1.0
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert float((await raw.hget(store.host_key(HOST), "backoff_until")) or 0) < (seconds + 60) * 1_000_000
