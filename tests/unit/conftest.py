"""Fixtures the Lua script modules share (tests/unit/test_claim_cases.py, test_redis_script_edges.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from tests.support.redis_server import RedisServer, running_redis, server_kinds

KINDS = server_kinds()


@pytest.fixture(scope="module", params=sorted(KINDS) or ["redis"])
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """One Redis server per module and kind (Redis 7, Redis 6.2, Valkey where installed)."""
    with running_redis(KINDS.get(request.param)) as s:
        yield s


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(server.url, decode_responses=True)
    yield client
    await client.aclose()
