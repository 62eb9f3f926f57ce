"""The pacer in-process: real asyncio on a virtual clock (tests/support/virtual_clock.py), a MemoryStore.
Orders, counts and exact times; the gaps are binary fractions, so every slot is exact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.stores.memory import MemoryStore
from tests.support.turns import paced
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
B = "index.commoncrawl.org"
GAP = 0.125


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(gap=GAP, max_wait=5.0, host_intervals=(), exempt_max_in_flight=16)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
async def store(vclock: VirtualClock) -> MemoryStore:
    return MemoryStore(clock=vclock, rand=lambda: 0.0)


@pytest.fixture
async def pacer(store: MemoryStore, vclock: VirtualClock) -> AsyncIterator[Pacer]:
    p = Pacer(store, settings(), monotonic=vclock)
    yield p
    await p.close()


async def test_fifo_per_host_and_one_slot_each(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    order: list[int] = []
    slots: list[float] = []

    async def one(i: int) -> None:
        await paced(pacer, A)
        order.append(i)
        slots.append(vclock() - T0)

    tasks = []
    for i in range(12):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(0)  # arrive in this order
    await asyncio.gather(*tasks)
    assert order == list(range(12))
    assert await store.grants() == 12 and pacer.snapshot().grants == 12
    assert pacer.snapshot().queued == 0
    assert slots == [k * GAP for k in range(12)]  # one slot per gap, exactly


async def test_longest_waiting_ready_host_goes_first(pacer: Pacer, vclock: VirtualClock) -> None:
    order: list[tuple[str, float]] = []

    async def one(tag: str, host: str) -> None:
        await paced(pacer, host)
        order.append((tag, vclock() - T0))

    tasks = []
    for tag, host in [("a1", A), ("b1", B), ("a2", A), ("b2", B), ("a3", A)]:
        tasks.append(asyncio.create_task(one(tag, host)))
        await asyncio.sleep(1 / 64)  # arrive in this order, all before the second slot
    await asyncio.gather(*tasks)
    assert order == [("a1", 0.0), ("b1", GAP), ("a2", 2 * GAP), ("b2", 3 * GAP), ("a3", 4 * GAP)]


async def test_host_in_backoff_does_not_delay_another_host(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    delay = await pacer._record(A, 503, 1.0)
    assert delay is not None and delay.seconds == 1.0
    done: dict[str, float] = {}

    async def one(tag: str, host: str) -> None:
        await paced(pacer, host)
        done[tag] = vclock() - T0

    # A is first in line, but in backoff; B's requests must not queue behind it.
    tasks = [asyncio.create_task(one("a", A))]
    await asyncio.sleep(1 / 64)
    tasks += [asyncio.create_task(one(f"b{i}", B)) for i in range(5)]
    await asyncio.gather(*tasks)
    assert [done[f"b{i}"] for i in range(5)] == [1 / 64 + k * GAP for k in range(5)]  # the first slots
    assert done["a"] == 1.0  # the Retry-After's end, exactly
    assert await store.grants() == 6


async def test_cancelled_waiter_leaves_without_spending_a_slot(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    pacer.reload(settings(gap=0.25))
    first = asyncio.create_task(paced(pacer, A))
    await first  # granted at once; the next slot is 0.25 s out
    second = asyncio.create_task(paced(pacer, A))
    await asyncio.sleep(0)
    third = asyncio.create_task(paced(pacer, A))
    fourth = asyncio.create_task(paced(pacer, A))
    await asyncio.sleep(1 / 16)
    # The dispatcher now holds the second's slot. The third waits in line, unclaimed: it leaves for free.
    third.cancel()
    await asyncio.sleep(1 / 64)
    assert pacer.snapshot().queued_by_host.get(A, 0) == 1
    await second
    assert vclock() - T0 == 0.25
    await asyncio.sleep(1 / 16)
    # The fourth holds the next reserved slot; it leaves during the wait and nobody is behind it.
    fourth.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    with pytest.raises(asyncio.CancelledError):
        await fourth
    await asyncio.sleep(0.5)  # past the fourth's slot (0.5)
    # first, second, and the slot reserved for the fourth before it left; never one for the third.
    assert await store.grants() == 3
    assert pacer.snapshot().queued == 0


async def test_a_reserved_slot_passes_to_the_next_in_line(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    pacer.reload(settings(gap=0.25))
    await paced(pacer, A)
    second = asyncio.create_task(paced(pacer, A))
    await asyncio.sleep(1 / 64)  # the dispatcher reserved a slot for the second
    third = asyncio.create_task(paced(pacer, A))
    await asyncio.sleep(1 / 64)
    second.cancel()
    await third  # takes the second's slot
    assert vclock() - T0 == 0.25
    assert await store.grants() == 2
    assert second.cancelled()


async def test_max_wait_answers_at_once_with_an_estimate(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    pacer.reload(settings(max_wait=0.5))
    await pacer._record(A, 503, 10.0)
    with pytest.raises(WaitTooLong) as e:
        await paced(pacer, A)
    assert vclock() == T0  # answered at once: it did not wait for nothing
    assert e.value.wait == 10.0  # the backoff left
    assert A in e.value.why
    assert await store.grants() == 0
    # Another host is unaffected.
    assert await paced(pacer, B) == 0.0
    assert await store.grants() == 1


async def test_max_wait_from_the_queue_depth(pacer: Pacer, store: MemoryStore) -> None:
    pacer.reload(settings(gap=0.25, max_wait=0.5))
    results = await asyncio.gather(*(paced(pacer, A) for _ in range(6)), return_exceptions=True)
    # The k-th in line waits k gaps: 0, 0.25 and 0.5 fit; the others would wait 0.75 and are refused.
    assert results[:3] == [0.0, 0.25, 0.5]
    assert [r.wait for r in results[3:] if isinstance(r, WaitTooLong)] == [0.75] * 3
    assert await store.grants() == 3  # a rejected request spent no slot


async def test_max_wait_when_another_process_holds_the_schedule(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    pacer.reload(settings(max_wait=1.0))
    store.global_next = vclock() + 10.0  # as if other proxies sharing the store booked 10 s ahead
    with pytest.raises(WaitTooLong) as e:
        await paced(pacer, A)
    assert e.value.wait == 10.0 and vclock() == T0  # the store's estimate, at once
    assert await store.grants() == 0


async def test_success_resets_a_throttle_count_recorded_elsewhere(pacer: Pacer, store: MemoryStore) -> None:
    policy = BackoffPolicy(jitter=0.0)
    # Throttles recorded by another proxy sharing the store, or by this one before a restart.
    await store.throttled(A, 0.0, policy)
    await store.throttled(A, 0.0, policy)
    assert (await store.host_view(A)).throttles == 2
    assert await pacer._record(A, 200, None) is None
    assert (await store.host_view(A)).throttles == 0


async def test_throttle_codes_and_connection_failures(pacer: Pacer, store: MemoryStore) -> None:
    pacer.reload(settings(backoff=BackoffPolicy(base=0.01, jitter=0.0)))
    for code in (429, 503, 403, 500, None):
        assert await pacer._record(A, code, None) is not None
    assert (await store.host_view(A)).throttles == 5
    for code in (200, 206, 404, 416):
        assert await pacer._record(B, code, None) is None
    assert (await store.host_view(B)).throttles == 0


async def test_retry_after_cut_by_the_cap_is_logged(pacer: Pacer, caplog: pytest.LogCaptureFixture) -> None:
    pacer.reload(settings(backoff=BackoffPolicy(cap=60.0)))
    d = await pacer._record(A, 429, 3600.0)
    assert d is not None and d.seconds == 60.0
    assert any("3600" in r.getMessage() and "cap" in r.getMessage() for r in caplog.records)


async def test_exempt_bound_and_no_schedule(pacer: Pacer, store: MemoryStore, vclock: VirtualClock) -> None:
    pacer.reload(settings(gap=0.25, exempt_max_in_flight=3))
    now_in, peak = 0, 0

    async def read() -> None:
        nonlocal now_in, peak
        async with pacer.permit(A, Klass.EXEMPT):
            now_in += 1
            peak = max(peak, now_in)
            await asyncio.sleep(1 / 32)
            now_in -= 1

    # A saturated paced queue on the same host meanwhile.
    held = [asyncio.create_task(paced(pacer, A)) for _ in range(10)]
    await asyncio.sleep(1 / 64)
    await asyncio.gather(*(read() for _ in range(30)))
    assert peak == 3
    assert vclock() - T0 == 1 / 64 + 10 / 32  # 30 reads, 3 at a time: the paced queue held none back
    assert A not in pacer.snapshot().exempt_in_flight  # an idle host keeps no entry
    assert sum(t.done() for t in held) == 2  # the slots at 0 and 0.25; the paced ones still queue
    assert await store.grants() == 3  # those two and the one reserved for 0.5: exempt reads took none
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_exempt_bound_follows_a_reload(pacer: Pacer) -> None:
    pacer.reload(settings(exempt_max_in_flight=1))
    peak, now_in = 0, 0
    gate = asyncio.Event()

    async def read() -> None:
        nonlocal now_in, peak
        async with pacer.permit(A, Klass.EXEMPT):
            now_in += 1
            peak = max(peak, now_in)
            await gate.wait()
            now_in -= 1

    tasks = [asyncio.create_task(read()) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert now_in == 1
    pacer.reload(settings(exempt_max_in_flight=4))  # raising the bound lets the waiting ones in
    await asyncio.sleep(0.05)
    assert now_in == 4
    gate.set()
    await asyncio.gather(*tasks)


async def test_exempt_respects_active_backoff(pacer: Pacer, vclock: VirtualClock) -> None:
    await pacer._record(A, 503, 0.375)
    async with pacer.permit(A, Klass.EXEMPT) as p:
        assert p.waited == 0.375 == vclock() - T0  # exactly the backoff left
    # Beyond max_wait: refused at once.
    pacer.reload(settings(max_wait=0.125))
    await pacer._record(A, 503, 5.0)
    with pytest.raises(WaitTooLong) as e:
        async with pacer.permit(A, Klass.EXEMPT):
            pass
    assert e.value.wait == 5.0 and vclock() - T0 == 0.375
    # Configured not to respect it: goes at once.
    pacer.reload(settings(exempt_respect_backoff=False))
    async with pacer.permit(A, Klass.EXEMPT) as p:
        assert p.waited == 0.0


async def test_reload_changes_the_gap(pacer: Pacer, vclock: VirtualClock) -> None:
    pacer.reload(settings(gap=0.0))
    await asyncio.gather(*(paced(pacer, A) for _ in range(50)))
    assert vclock() == T0  # pacing off: no wait at all
    pacer.reload(settings(gap=0.25))
    await asyncio.gather(*(paced(pacer, A) for _ in range(5)))
    assert vclock() - T0 == 4 * 0.25  # the first at once, then one per new gap


async def test_a_full_line_of_a_host_in_backoff_does_not_refuse_another_host(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    pacer.reload(settings(gap=1 / 64, max_wait=1.0))
    await pacer._record(A, 503, 0.5)
    # Fill A's line until the estimate refuses more: the k-th waits 0.5 + k/64 s, within max_wait for k <= 32.
    waiting = [asyncio.create_task(paced(pacer, A)) for _ in range(60)]
    await asyncio.sleep(1 / 16)
    assert pacer.snapshot().queued_by_host.get(A, 0) == 33  # the line is full: the rest were refused
    # B is ready and nothing that could go now is ahead of it: it goes at once instead of being refused.
    assert await paced(pacer, B) == 0.0
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert results[0] == 0.5  # the backoff's end
    # Then the throttle's adaptive interval (1 s, pacing.adaptive) puts A's next slot past every deadline:
    # the dispatcher refuses the line (the first would wait 1 s more), the estimate at arrival cannot know.
    assert all(isinstance(r, WaitTooLong) for r in results[1:])
    assert isinstance(results[1], WaitTooLong) and results[1].wait == 1.0
    assert [r.wait for r in results[33:] if isinstance(r, WaitTooLong)] == [0.5 + 33 / 64] * 27
