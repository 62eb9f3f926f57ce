"""Fixtures the Lua script modules share (tests/unit/stores/test_claim_cases.py and
test_redis_script_edges.py), and those of the lean client's tests (tests/unit/proxy/test_h1client_*.py,
defined in tests/support/rawupstream.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.support.rawupstream import ca, make_client, server_tls  # noqa: F401 - fixtures, found by name
from tests.support.redis_server import RedisServer, redis_fixture

server = redis_fixture("server", scope="module", each_kind=True)  # one per module and server kind


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(server.url, decode_responses=True)
    yield client
    await client.aclose()
