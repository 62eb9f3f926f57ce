"""The request window through the pacer (issue 24 item 1), on a virtual clock with a MemoryStore: a full
window holds paced and exempt requests alike until its oldest bucket has left (window plus LATE), and one
that would wait past max_wait is refused with a reason that names the window. An exempt read waiting for
one of the host's places is not counted until it has one (the place comes first, then the slot)."""

from __future__ import annotations

import asyncio

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.classify import Klass
from politeproxy.policy.window import LATE
from politeproxy.stores.memory import MemoryStore
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
WINDOW, LIMIT = 8.0, 3  # buckets of 0.16 s


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(
        gap=0.0, max_wait=30.0, host_intervals=(), exempt_max_in_flight=16, exempt_rate=0.0,
        egress="e", window=WINDOW, window_limit=LIMIT,
    )  # fmt: skip
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


async def _through(pacer: Pacer, klass: Klass, vclock: VirtualClock) -> float:
    async with pacer.permit(A, klass):
        return vclock() - T0


async def test_a_full_window_holds_every_class_until_its_oldest_bucket_leaves(vclock: VirtualClock) -> None:
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, settings(), monotonic=vclock)
    try:
        kinds = [Klass.PACED, Klass.EXEMPT, Klass.PACED, Klass.EXEMPT, Klass.PACED]
        times = await asyncio.gather(*(_through(pacer, k, vclock) for k in kinds))
        first, rest = sorted(times)[:LIMIT], sorted(times)[LIMIT:]
        assert first == [0.0] * LIMIT
        # The first three sit in the bucket [T0, T0 + 0.16): the next go once it is out of the window plus
        # LATE, at 0.16 + 8 + 1 s (to the store's EPSILON and the dispatcher's re-ask).
        assert all(WINDOW + LATE + 0.16 <= t < WINDOW + LATE + 0.3 for t in rest), times
    finally:
        await pacer.close()


async def test_a_window_wait_past_max_wait_is_refused_and_named(vclock: VirtualClock) -> None:
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, settings(max_wait=2.0), monotonic=vclock)
    try:
        for _ in range(LIMIT):
            await _through(pacer, Klass.EXEMPT, vclock)
        for klass in (Klass.EXEMPT, Klass.PACED):
            with pytest.raises(WaitTooLong) as e:
                await _through(pacer, klass, vclock)
            assert "request window" in e.value.message and A in e.value.message, e.value.message
        assert vclock() - T0 < 0.5  # refused at once: the wait is known, nobody holds a client for it
    finally:
        await pacer.close()


async def test_an_exempt_read_waiting_for_a_place_is_not_counted_yet(vclock: VirtualClock) -> None:
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, settings(exempt_max_in_flight=1, window=64.0, window_limit=100), monotonic=vclock)
    rule = pacer._settings.window_for(A)
    assert rule is not None
    hold = asyncio.Event()

    async def read() -> None:
        async with pacer.permit(A, Klass.EXEMPT):
            await hold.wait()

    try:
        first = asyncio.create_task(read())
        await asyncio.sleep(0.25)
        second = asyncio.create_task(read())  # waits for the one place, 20 s here
        await asyncio.sleep(20.0)
        assert await store.window_used(rule) == 1, "a read still waiting for a place was counted"
    finally:
        hold.set()
        await asyncio.gather(first, second, return_exceptions=True)
        await pacer.close()
