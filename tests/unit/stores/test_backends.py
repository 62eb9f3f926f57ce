"""The store contract every backend passes (issue 44 item 4): one fixture over every ``Backend``, so a
fourth backend added to the enum fails here until it is built and passes the same tests. Two objects of a
backend stand for two proxies sharing it (the memory store is one process's: its "two" are one object).
No virtual clock: the Redis store reads the server's TIME, so these tests take only what every store can
show at once (virtual-clock cases of the same rules: test_contract.py and test_claim_cases.py). Also: the
public classes of the stores, the pacer and the app each say what they are."""

from __future__ import annotations

import ast
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import politeproxy
from politeproxy.policy.slots import Claim, Outcome
from politeproxy.policy.window import WindowRule
from politeproxy.stores.base import BACKENDS, Backend, FailoverSide
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.store_helpers import NOJITTER, H

redis_one = redis_fixture("redis_one", scope="module")  # the system redis-server
OTHER = "index.commoncrawl.org"
PACKAGE = Path(politeproxy.__file__).parent
Pair = tuple[FailoverSide, FailoverSide]


def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Pair:
    one = MemoryStore(rand=lambda: 0.0)
    return one, one


def _file(request: pytest.FixtureRequest, tmp_path: Path) -> Pair:
    return FileStore(tmp_path, rand=lambda: 0.0), FileStore(tmp_path, rand=lambda: 0.0)


def _redis(request: pytest.FixtureRequest, tmp_path: Path) -> Pair:
    server: RedisServer = request.getfixturevalue("redis_one")
    prefix = f"pp-contract-{uuid.uuid4().hex[:8]}:"
    return RedisStore(server.url, prefix=prefix, rand=lambda: 0.0), RedisStore(server.url, prefix=prefix)


# A new backend: its value in stores.base.Backend, and here the way to make two proxies' stores of it.
MAKERS: dict[Backend, Callable[[pytest.FixtureRequest, Path], Pair]] = {
    Backend.MEMORY: _memory,
    Backend.FILE: _file,
    Backend.REDIS: _redis,
}


def test_every_backend_is_under_the_contract() -> None:
    assert set(MAKERS) == set(Backend) and set(BACKENDS) == {b.value for b in Backend}


@pytest.fixture(params=sorted(MAKERS))
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    a, b = MAKERS[request.param](request, tmp_path)
    yield a, b
    await a.close()
    if b is not a:
        await b.close()


async def test_the_store_names_its_backend(pair: Pair) -> None:
    a, _b = pair
    assert a.name in BACKENDS and not a.degraded


async def _slot(s: FailoverSide) -> tuple[Claim, float]:
    """A claim and its slot in the schedule's own clock. The Redis store's ``at`` is re-based on the local
    clock when its answer arrives, so a reply that came late under load moves it (one step measured
    0.19497 s so in a clean-clone run); its slot in the server's clock is exact."""
    if isinstance(s, RedisStore):
        return await s.claim_with_server_time(H, 0.2, 0.0, None)
    c = await s.claim(H, 0.2, 0.0, None)
    return c, c.at


async def test_one_schedule_for_every_proxy_on_it(pair: Pair) -> None:
    a, b = pair
    before = await a.grants()
    got = [await _slot(s) for s in (a, b, a, b)]
    assert all(c.granted for c, _ in got)
    # Slots a gap apart on one schedule, whichever proxy asked: never closer (1 us: the Redis store keeps
    # whole microseconds), and not much later (loosely: a loaded box's calls).
    steps = [t2 - t1 for (_, t1), (_, t2) in zip(got, got[1:], strict=False)]
    assert all(0.2 - 1e-6 <= d < 0.3 for d in steps), steps
    assert await b.grants() == before + 4


async def test_a_backoff_is_shared_and_reserves_nothing(pair: Pair) -> None:
    a, b = pair
    assert (await a.throttled(H, 30.0, NOJITTER)).seconds == 30.0
    before = await b.grants()
    c = await b.claim(H, 0.01, 0.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and 29.0 < c.wait <= 30.0
    c = await b.claim(H, 0.01, 0.0, 1.0)
    assert c.outcome is Outcome.TOO_LATE
    assert await a.grants() == before  # nothing was reserved for the host in backoff
    assert (await b.claim(OTHER, 0.01, 0.0, None)).granted  # the other host is not held
    view = await b.host_view(H)
    assert view.throttles == 1 and 29.0 < view.backoff_in <= 30.0
    held = await b.exempt_claim(H, 0.0, 0, None)
    assert held.outcome is Outcome.HOST_NOT_READY  # exempt reads wait out a backoff too


async def test_backoff_grows_and_a_success_resets_the_count(pair: Pair) -> None:
    a, b = pair
    delays = [(await s.throttled(H, None, NOJITTER)).seconds for s in (a, b, a)]
    assert delays == [1.0, 2.0, 4.0]
    await b.succeeded(H)
    assert (await a.host_view(H)).throttles == 0


async def test_release_lifts_a_hold_for_every_proxy(pair: Pair) -> None:
    a, b = pair
    await a.throttled(H, 60.0, NOJITTER)
    await b.release(H)
    view = await a.host_view(H)
    assert view.backoff_in == 0 and view.throttles == 0
    assert (await a.claim(H, 0.01, 0.0, None)).granted


async def test_mirror_backoff_and_crawl_delay(pair: Pair) -> None:
    a, b = pair
    await a.mirror_backoff(H, 20.0)
    view = await b.host_view(H)
    assert 19.0 < view.backoff_in <= 20.0 and view.throttles == 0  # pushed out, no throttle counted
    await a.set_crawl_delay(OTHER, 3.0, ttl=60)
    view = await b.host_view(OTHER)
    assert view.crawl_delay == 3.0 and view.robots_fresh
    assert (await b.claim(OTHER, 0.01, 0.0, None)).granted
    c = await a.claim(OTHER, 0.01, 0.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and 2.5 < c.wait <= 3.0


async def test_the_window_counts_every_claim_and_copies_out(pair: Pair) -> None:
    a, b = pair
    rule = WindowRule("data", "local", 60.0, 3)
    for s in (a, b, a):
        assert (await s.claim(H, 0.0, 0.0, 5.0, window=rule)).granted
    assert await b.window_used(rule) == 3
    c = await b.claim(H, 0.0, 0.0, 5.0, window=rule)
    assert not c.granted and c.window
    assert sum(n for _end, n in await a.window_counts(rule)) == 3  # what a failover copies to its fallback


@pytest.mark.parametrize("path", ["stores", "pacing/pacer.py", "app.py"])
def test_every_public_class_says_what_it_is(path: str) -> None:
    target = PACKAGE / path
    files = sorted(target.glob("*.py")) if target.is_dir() else [target]
    bare = [
        f"{f.name}: {node.name}"
        for f in files
        for node in ast.parse(f.read_text()).body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not ast.get_docstring(node)
    ]
    assert not bare, bare
