"""Fixtures the Redis store modules share (tests/e2e/test_redis_store.py, test_redis_processes.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, running_redis, server_kinds

KINDS = server_kinds()


@pytest.fixture(scope="module", params=sorted(KINDS) or ["redis"])
def shared_redis(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """Each store test runs against Redis 7 (Debian), Redis 6.2 and Valkey: the issue promises all three.
    One server per module and kind."""
    with running_redis(KINDS.get(request.param)) as server:
        yield server


@pytest.fixture
def prefix() -> str:
    # A fresh prefix per test is a fresh, independent budget on the shared server.
    return f"pp-test-{uuid.uuid4().hex[:8]}:"
