"""Fixtures the Redis store modules share (tests/e2e/test_redis_store.py, test_redis_processes.py)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.redis_server import redis_fixture

# Each store test runs against every server kind; one server per module and kind (fast). The outage tests
# start their own (redis_fixture()), so killing theirs harms no one else.
shared_redis = redis_fixture("shared_redis", scope="module", each_kind=True)


@pytest.fixture
def prefix() -> str:
    # A fresh prefix per test is a fresh, independent budget on the shared server.
    return f"pp-test-{uuid.uuid4().hex[:8]}:"
