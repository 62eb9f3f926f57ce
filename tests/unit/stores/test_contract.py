"""The store contract the memory and file stores share (the claim, per-host intervals, backoff state),
and the memory store on a wall clock that steps back."""

from __future__ import annotations

from pathlib import Path

import pytest

from politeproxy.policy.slots import Outcome
from politeproxy.stores.base import Store
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from tests.support.store_helpers import NOJITTER, Clock, H


@pytest.fixture(params=["memory", "file"])
def store_and_clock(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, Clock]:
    clock = Clock()
    if request.param == "memory":
        return MemoryStore(clock, rand=lambda: 0.0), clock
    return FileStore(tmp_path, clock, rand=lambda: 0.0), clock


async def test_claims_follow_one_schedule(store_and_clock: tuple[Store, Clock]) -> None:
    store, clock = store_and_clock
    waits = [(await store.claim("data.commoncrawl.org", 0.2, 0.0, None)).wait for _ in range(4)]
    assert waits == pytest.approx([0.0, 0.2, 0.4, 0.6])
    assert await store.grants() == 4
    clock.t += 10  # idle: the next grant is at once, the one after a gap later
    c = await store.claim("index.commoncrawl.org", 0.2, 0.0, None)
    assert c.granted and c.wait == 0.0
    assert (await store.claim("data.commoncrawl.org", 0.2, 0.0, None)).wait == pytest.approx(0.2)
    await store.close()


async def test_not_ready_and_too_late_reserve_nothing(store_and_clock: tuple[Store, Clock]) -> None:
    store, clock = store_and_clock
    d = await store.throttled("data.commoncrawl.org", 2.0, NOJITTER)
    assert d.seconds == 2.0
    before = await store.grants()
    c = await store.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and c.wait == pytest.approx(2.0)
    c = await store.claim("data.commoncrawl.org", 0.2, 0.0, 1.0)
    assert c.outcome is Outcome.TOO_LATE and c.wait == pytest.approx(2.0)
    assert await store.grants() == before
    # The other host gets the very first slot: nothing was reserved for the host in backoff.
    c = await store.claim("index.commoncrawl.org", 0.2, 0.0, None)
    assert c.granted and c.wait == 0.0
    clock.t += 2.0
    c = await store.claim("data.commoncrawl.org", 0.2, 0.0, None)
    assert c.granted and c.wait == 0.0
    await store.close()


async def test_host_interval_is_per_host(store_and_clock: tuple[Store, Clock]) -> None:
    store, clock = store_and_clock
    assert (await store.claim("index.commoncrawl.org", 0.01, 1.0, None)).granted
    c = await store.claim("index.commoncrawl.org", 0.01, 1.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and c.wait == pytest.approx(1.0)
    assert (await store.claim("data.commoncrawl.org", 0.01, 0.0, None)).wait == pytest.approx(0.01)
    await store.set_crawl_delay("data.commoncrawl.org", 3.0, ttl=60)
    view = await store.host_view("data.commoncrawl.org")
    assert view.crawl_delay == 3.0 and view.robots_fresh
    clock.t += 1.0
    assert (await store.claim("data.commoncrawl.org", 0.01, 0.0, None)).granted
    c = await store.claim("data.commoncrawl.org", 0.01, 0.0, None)
    assert c.outcome is Outcome.HOST_NOT_READY and c.wait == pytest.approx(3.0)
    clock.t += 61
    assert not (await store.host_view("data.commoncrawl.org")).robots_fresh
    await store.close()


async def test_backoff_growth_and_reset(store_and_clock: tuple[Store, Clock]) -> None:
    store, clock = store_and_clock
    h = "data.commoncrawl.org"
    delays = []
    for _ in range(3):
        delays.append((await store.throttled(h, None, NOJITTER)).seconds)
    assert delays == [1.0, 2.0, 4.0]
    view = await store.host_view(h)
    assert (
        view.throttles == 3 and view.backoff_in == pytest.approx(4.0) and view.ready_in == pytest.approx(4.0)
    )
    await store.succeeded(h)
    assert (await store.host_view(h)).throttles == 0
    clock.t += 10
    assert (await store.throttled(h, None, NOJITTER)).seconds == 1.0
    await store.close()


# -- issue 9: clock steps ------------------------------------------------------------------------------


async def test_memory_store_survives_a_wall_clock_step_back() -> None:
    """The memory store keeps its own records, so it paces on the monotonic clock (item 19); and on any
    clock, a step back stalls it no longer than the sanity bound: 30 min back (within the old 1 h trust)
    stalled every paced request for 30 min before."""
    import time as time_mod

    c = await MemoryStore().claim(H, 0.1, 0.0, None)
    assert abs(c.at - time_mod.monotonic()) < 5.0  # slots on the monotonic clock, not the wall clock
    clock = Clock()
    s = MemoryStore(clock)
    assert (await s.claim(H, 0.1, 0.0, None)).granted
    clock.t -= 1800.0
    c = await s.claim(H, 0.1, 0.0, 60.0)
    assert c.granted and c.wait == pytest.approx(0.1)
