"""The exempt ceiling kept in the service's record (issue 24): several host names, one GCRA; the hold is
still read from the host's own record. Memory, file and Redis stores alike."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.slots import Outcome
from politeproxy.stores.base import Store
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, redis_fixture

KEY = "commoncrawl.s3.amazonaws.com"
redis_one = redis_fixture("redis_one", scope="module")  # the system redis-server
NAMES = (KEY, "commoncrawl.s3.us-east-1.amazonaws.com", "commoncrawl.s3.dualstack.us-east-1.amazonaws.com")


@pytest.fixture(params=["memory", "file", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    make: Callable[[], Store]
    if request.param == "memory":
        make = MemoryStore
    elif request.param == "file":
        make = lambda: FileStore(tmp_path)  # noqa: E731
    else:
        server: RedisServer = request.getfixturevalue("redis_one")
        make = lambda: RedisStore(server.url, prefix=f"pp-ceil-{uuid.uuid4().hex[:8]}:")  # noqa: E731
    s = make()
    try:
        yield s
    finally:
        await s.close()


async def test_names_share_one_ceiling(store: Store) -> None:
    """burst 3 at 10 s apart: three grants across the three names, the fourth waits, whichever name."""
    got = [await store.exempt_claim(n, 10.0, 3, 0.0, True, KEY) for n in NAMES]
    assert all(c.outcome is Outcome.GRANTED and c.wait < 0.05 for c in got)
    for n in NAMES:
        c = await store.exempt_claim(n, 10.0, 3, 0.0, True, KEY)
        assert c.outcome is Outcome.TOO_LATE and c.wait > 9.0


async def test_without_a_ceiling_key_each_host_has_its_own(store: Store) -> None:
    for n in NAMES:
        assert (await store.exempt_claim(n, 10.0, 1, 0.0)).granted


async def test_the_hold_stays_the_hosts_own(store: Store) -> None:
    """A backoff on one name holds that name's reads, not the others' (backoffs stay per host)."""
    await store.throttled(NAMES[1], 30.0, BackoffPolicy())
    held = await store.exempt_claim(NAMES[1], 0.01, 100, 0.0, True, KEY)
    assert held.outcome is Outcome.TOO_LATE and held.wait > 20
    assert (await store.exempt_claim(NAMES[2], 0.01, 100, 0.0, True, KEY)).granted
    assert (await store.exempt_claim(NAMES[1], 0.01, 100, 0.0, False, KEY)).granted


async def test_places_are_per_service() -> None:
    """max_in_flight counts every name of the bucket together (pacing/exempt.py keys by service)."""
    from politeproxy.pacing.exempt import ExemptPlaces

    places = ExemptPlaces(lambda: 2)
    await places.acquire(NAMES[1])
    await places.acquire(NAMES[2])
    assert places.in_flight(NAMES[0]) == 2
    assert places.snapshot() == {KEY: 2}
    places.release(NAMES[0])
    assert places.in_flight(NAMES[1]) == 1
    places.release(NAMES[2])
    assert places.hosts() == set()
