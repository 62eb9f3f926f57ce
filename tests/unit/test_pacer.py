"""The pacer in-process: real asyncio, a MemoryStore, short gaps. Order and counts, never speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.stores.memory import MemoryStore

A = "data.commoncrawl.org"
B = "index.commoncrawl.org"


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(gap=0.02, max_wait=5.0, host_intervals=(), exempt_max_in_flight=16)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore(rand=lambda: 0.0)


@pytest.fixture
async def pacer(store: MemoryStore) -> AsyncIterator[Pacer]:
    p = Pacer(store, settings())
    yield p
    await p.close()


async def test_fifo_per_host_and_one_slot_each(pacer: Pacer, store: MemoryStore) -> None:
    order: list[int] = []
    slots: list[float] = []

    async def one(i: int) -> None:
        await pacer.wait_paced(A)
        order.append(i)
        slots.append(time.time())

    tasks = []
    for i in range(12):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(0)  # arrive in this order
    await asyncio.gather(*tasks)
    assert order == list(range(12))
    assert await store.grants() == 12 and pacer.grants == 12
    assert pacer.depth() == 0
    # Store slots are gap apart; a task runs at or after its slot, so 11 gaps span at least 11 * gap.
    assert slots[-1] - slots[0] >= 11 * 0.02 - 0.002


async def test_longest_waiting_ready_host_goes_first(pacer: Pacer) -> None:
    pacer.update(settings(gap=0.05))
    order: list[str] = []

    async def one(tag: str, host: str) -> None:
        await pacer.wait_paced(host)
        order.append(tag)

    tasks = []
    for tag, host in [("a1", A), ("b1", B), ("a2", A), ("b2", B), ("a3", A)]:
        tasks.append(asyncio.create_task(one(tag, host)))
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    assert order == ["a1", "b1", "a2", "b2", "a3"]


async def test_host_in_backoff_does_not_delay_another_host(pacer: Pacer, store: MemoryStore) -> None:
    delay = await pacer.record(A, 503, 1.0)
    assert delay is not None and delay.seconds == 1.0
    done: dict[str, float] = {}
    t0 = time.monotonic()

    async def one(tag: str, host: str) -> None:
        await pacer.wait_paced(host)
        done[tag] = time.monotonic() - t0

    # A is first in line, but in backoff; B's requests must not queue behind it.
    tasks = [asyncio.create_task(one("a", A))]
    await asyncio.sleep(0.01)
    tasks += [asyncio.create_task(one(f"b{i}", B)) for i in range(5)]
    await asyncio.gather(*tasks)
    assert max(done[f"b{i}"] for i in range(5)) < done["a"]
    assert done["a"] >= 0.95  # Retry-After 1 s
    # Generous bound: five 20 ms slots, far from the 1 s the backoff would have imposed.
    assert max(done[f"b{i}"] for i in range(5)) < 0.6
    assert await store.grants() == 6


async def test_cancelled_waiter_leaves_without_spending_a_slot(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(gap=0.3))
    first = asyncio.create_task(pacer.wait_paced(A))
    await first  # granted at once; the next slot is 0.3 s out
    second = asyncio.create_task(pacer.wait_paced(A))
    await asyncio.sleep(0)
    third = asyncio.create_task(pacer.wait_paced(A))
    fourth = asyncio.create_task(pacer.wait_paced(A))
    await asyncio.sleep(0.05)
    # The dispatcher now holds the second's slot. The third waits in line, unclaimed: it leaves for free.
    third.cancel()
    await asyncio.sleep(0.01)
    assert pacer.depth(A) == 1
    await second
    await asyncio.sleep(0.05)
    # The fourth holds the next reserved slot; it leaves during the wait and nobody is behind it.
    fourth.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    with pytest.raises(asyncio.CancelledError):
        await fourth
    await asyncio.sleep(0.4)
    # first, second, and the slot reserved for the fourth before it left; never one for the third.
    assert await store.grants() == 3
    assert pacer.depth() == 0


async def test_a_reserved_slot_passes_to_the_next_in_line(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(gap=0.3))
    await pacer.wait_paced(A)
    second = asyncio.create_task(pacer.wait_paced(A))
    await asyncio.sleep(0.02)  # the dispatcher reserved a slot for the second
    third = asyncio.create_task(pacer.wait_paced(A))
    await asyncio.sleep(0.02)
    second.cancel()
    await third  # takes the second's slot
    assert await store.grants() == 2
    assert second.cancelled()


async def test_max_wait_answers_at_once_with_an_estimate(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(gap=0.02, max_wait=0.5))
    await pacer.record(A, 503, 10.0)
    t0 = time.monotonic()
    with pytest.raises(WaitTooLong) as e:
        await pacer.wait_paced(A)
    assert time.monotonic() - t0 < 0.5  # answered before max_wait ran out: it did not wait for nothing
    assert 9.0 <= e.value.wait <= 10.0
    assert A in e.value.why
    assert await store.grants() == 0
    # Another host is unaffected.
    await pacer.wait_paced(B)
    assert await store.grants() == 1


async def test_max_wait_from_the_queue_depth(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(gap=0.2, max_wait=0.5))
    results = await asyncio.gather(*(pacer.wait_paced(A) for _ in range(6)), return_exceptions=True)
    granted = [r for r in results if not isinstance(r, BaseException)]
    rejected = [r for r in results if isinstance(r, WaitTooLong)]
    assert len(granted) + len(rejected) == 6
    assert 2 <= len(granted) <= 4
    assert all(r.wait > 0.5 for r in rejected)
    assert await store.grants() == len(granted)  # a rejected request spent no slot


async def test_max_wait_when_another_process_holds_the_schedule(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(gap=0.02, max_wait=1.0))
    store.global_next = store.sm.clock() + 10.0  # as if other proxies sharing the store booked 10 s ahead
    with pytest.raises(WaitTooLong) as e:
        await pacer.wait_paced(A)
    assert e.value.wait == pytest.approx(10.0, abs=0.5)
    assert await store.grants() == 0


async def test_success_resets_a_throttle_count_recorded_elsewhere(pacer: Pacer, store: MemoryStore) -> None:
    policy = BackoffPolicy(jitter=0.0)
    # Throttles recorded by another proxy sharing the store, or by this one before a restart.
    await store.throttled(A, 0.0, policy)
    await store.throttled(A, 0.0, policy)
    assert (await store.host_view(A)).throttles == 2
    assert await pacer.record(A, 200, None) is None
    assert (await store.host_view(A)).throttles == 0


async def test_throttle_codes_and_connection_failures(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(backoff=BackoffPolicy(base=0.01, jitter=0.0)))
    for code in (429, 503, 403, 500, None):
        assert await pacer.record(A, code, None) is not None
    assert (await store.host_view(A)).throttles == 5
    for code in (200, 206, 404, 416):
        assert await pacer.record(B, code, None) is None
    assert (await store.host_view(B)).throttles == 0


async def test_retry_after_cut_by_the_cap_is_logged(pacer: Pacer, caplog: pytest.LogCaptureFixture) -> None:
    pacer.update(settings(backoff=BackoffPolicy(cap=60.0)))
    d = await pacer.record(A, 429, 3600.0)
    assert d is not None and d.seconds == 60.0
    assert any("3600" in r.getMessage() and "cap" in r.getMessage() for r in caplog.records)


async def test_exempt_bound_and_no_schedule(pacer: Pacer, store: MemoryStore) -> None:
    pacer.update(settings(gap=0.2, exempt_max_in_flight=3))
    now_in, peak = 0, 0

    async def read() -> None:
        nonlocal now_in, peak
        async with pacer.exempt(A):
            now_in += 1
            peak = max(peak, now_in)
            await asyncio.sleep(0.02)
            now_in -= 1

    # A saturated paced queue on the same host meanwhile.
    paced = [asyncio.create_task(pacer.wait_paced(A)) for _ in range(10)]
    await asyncio.sleep(0.01)
    await asyncio.gather(*(read() for _ in range(30)))
    assert peak == 3
    assert pacer.in_flight.get(A, 0) == 0  # an idle host keeps no entry
    assert sum(t.done() for t in paced) < 10  # 30 exempt reads finished while paced ones still queue
    assert await store.grants() < 10  # exempt reads took no slots
    for t in paced:
        t.cancel()
    await asyncio.gather(*paced, return_exceptions=True)


async def test_exempt_bound_follows_a_reload(pacer: Pacer) -> None:
    pacer.update(settings(exempt_max_in_flight=1))
    peak, now_in = 0, 0
    gate = asyncio.Event()

    async def read() -> None:
        nonlocal now_in, peak
        async with pacer.exempt(A):
            now_in += 1
            peak = max(peak, now_in)
            await gate.wait()
            now_in -= 1

    tasks = [asyncio.create_task(read()) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert now_in == 1
    pacer.update(settings(exempt_max_in_flight=4))  # raising the bound lets the waiting ones in
    await asyncio.sleep(0.05)
    assert now_in == 4
    gate.set()
    await asyncio.gather(*tasks)


async def test_exempt_respects_active_backoff(pacer: Pacer) -> None:
    await pacer.record(A, 503, 0.3)
    t0 = time.monotonic()
    async with pacer.exempt(A):
        waited = time.monotonic() - t0
    assert waited >= 0.25
    # Beyond max_wait: refused at once.
    pacer.update(settings(max_wait=0.1))
    await pacer.record(A, 503, 5.0)
    with pytest.raises(WaitTooLong):
        async with pacer.exempt(A):
            pass
    # Configured not to respect it: goes at once.
    pacer.update(settings(exempt_respect_backoff=False))
    async with pacer.exempt(A) as w:
        assert w < 0.1


async def test_reload_changes_the_gap(pacer: Pacer) -> None:
    pacer.update(settings(gap=0.0))
    await asyncio.gather(*(pacer.wait_paced(A) for _ in range(50)))
    pacer.update(settings(gap=0.05))
    t0 = time.monotonic()
    await asyncio.gather(*(pacer.wait_paced(A) for _ in range(5)))
    assert time.monotonic() - t0 >= 4 * 0.05 - 0.01


async def test_a_full_line_of_a_host_in_backoff_does_not_refuse_another_host(
    pacer: Pacer, store: MemoryStore
) -> None:
    pacer.update(settings(gap=0.02, max_wait=1.0))
    await pacer.record(A, 503, 0.5)
    # Fill A's line until the estimate refuses more: about max_wait / gap requests wait behind the backoff.
    waiting = [asyncio.create_task(pacer.wait_paced(A)) for _ in range(60)]
    await asyncio.sleep(0.05)
    assert 20 <= pacer.depth(A) < 60  # the line is full: the rest were refused
    # B is ready and nothing that could go now is ahead of it: it goes at once instead of being refused.
    t0 = time.monotonic()
    await pacer.wait_paced(B)
    assert time.monotonic() - t0 < 0.4
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(r, float | WaitTooLong) for r in results)
    assert any(isinstance(r, WaitTooLong) for r in results)
