"""A request that cannot be granted within max_wait is refused as soon as that is known (issue 25 item 7),
with a Retry-After that says when the host could go, not held to its deadline and told "1 s". On the
virtual clock, the real Pacer over the real MemoryStore.

The case: the fair queue serves another pipeline's head first (it was served less), the store answers that
the host waits (a backoff another proxy recorded), and this request's max_wait ends before that."""

from __future__ import annotations

import asyncio

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.stores.memory import MemoryStore
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
POLICY = BackoffPolicy(base=1.0, factor=2.0, cap=60.0, jitter=0.0, adaptive=False)


async def test_a_waiter_whose_deadline_comes_before_the_host_is_refused_at_once(vclock: VirtualClock) -> None:
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    settings = PacingSettings(gap=0.25, max_wait=3.0, host_intervals=(), backoff=POLICY)
    pacer = Pacer(store, settings, monotonic=vclock)

    async def send(pipeline: str, arrived: float | None = None) -> None:
        async with pacer.permit(A, Klass.PACED, arrived=arrived, pipeline=pipeline):
            pass

    try:
        for _ in range(4):  # x is served first: y's next slot then comes before x's (fair queuing)
            await send("x")
        await asyncio.sleep(1.0 - (vclock() - T0))
        await store.throttled(A, 2.875, POLICY)  # another proxy got Retry-After: the host waits to 3.875
        # Both enter before the dispatcher looks. x arrived half a second ago (its max_wait ends at 3.5,
        # before the host may go); y's ends at 4.0, so y is served first and its claim says "wait".
        x = asyncio.create_task(send("x", arrived=vclock() - 0.5))
        y = asyncio.create_task(send("y"))
        with pytest.raises(WaitTooLong) as e:
            await x
        refused_at = vclock() - T0
        assert refused_at < 1.5, refused_at  # known at y's claim, not at x's deadline (3.55)
        assert 2.5 <= e.value.wait <= 2.875, e.value.wait  # Retry-After: when the host could go
        await y
        assert vclock() - T0 >= 3.875 - 1e-6
    finally:
        await pacer.close()


async def test_a_granted_slot_is_kept_when_the_dispatcher_wakes_late(
    vclock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store granted the third request its slot at 1.0 s, inside its max_wait (1.0 s); the dispatcher
    then wakes 0.2 s late (a busy loop). The request goes: it is not held to max_wait and told 1 s."""
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, PacingSettings(gap=0.5, max_wait=1.0, host_intervals=()), monotonic=vclock)

    async def late(self: object, host: str) -> bool:
        await asyncio.sleep(0.25)  # a late wake-up after the slot's sleep
        return False

    monkeypatch.setattr("politeproxy.pacing.dispatcher.Dispatcher._throttled_meanwhile", late)

    async def send() -> float:
        async with pacer.permit(A, Klass.PACED):
            return vclock() - T0

    try:
        times = await asyncio.gather(*(send() for _ in range(3)))
        assert times[2] >= 1.0, times  # the third slot is at 1.0: granted, delivered late
    finally:
        await pacer.close()


async def test_waiters_a_later_pipeline_pushes_past_max_wait_are_refused_then(vclock: VirtualClock) -> None:
    """x queues 30 requests (let in: 30 slots of 0.2 s fit its 8 s max_wait); y then queues 30 and takes
    every other slot. x's last ones cannot go within max_wait any more: they are refused within a sweep
    (0.5 s), with the wait their place says, instead of at 8 s with "1 s" (issue 25's outside re-run);
    every request that was not refused went within its max_wait."""
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, PacingSettings(gap=0.2, max_wait=8.0, host_intervals=()), monotonic=vclock)
    refused: list[tuple[str, float, float]] = []
    went: list[float] = []

    async def send(pipeline: str) -> None:
        t0 = vclock()
        try:
            async with pacer.permit(A, Klass.PACED, pipeline=pipeline):
                went.append(vclock() - t0)
        except WaitTooLong as e:
            refused.append((pipeline, vclock() - t0, e.wait))

    try:
        xs = [asyncio.create_task(send("x")) for _ in range(30)]
        await asyncio.sleep(0.1)
        ys = [asyncio.create_task(send("y")) for _ in range(30)]
        await asyncio.gather(*xs, *ys)
        late_x = [r for r in refused if r[0] == "x"]
        assert 5 <= len(late_x) <= 15 and not [r for r in refused if r[1] >= 1.2], refused
        assert all(held < 1.2 and wait > 8.0 - held for _p, held, wait in late_x), late_x
        assert max(went) <= 8.0 + 1e-6
    finally:
        await pacer.close()
