"""Hold bounds that fit the client (issue 41): a permit's own bound replaces max_wait, a request known to wait
past it is refused at once, and an SDK's retry goes ahead of first tries in its line. On virtual time."""

from __future__ import annotations

import asyncio

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.pacing.state import QueueState, Waiter
from politeproxy.policy.classify import Klass
from politeproxy.policy.clients import ClientRule
from politeproxy.stores.memory import MemoryStore
from tests.support.virtual_clock import VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "commoncrawl.s3.amazonaws.com"


def pacer(vclock: VirtualClock, gap: float = 1.0, max_wait: float = 5.0) -> Pacer:
    s = PacingSettings(gap=gap, max_wait=max_wait, host_intervals=(), retries=0, window_limit=0)
    return Pacer(MemoryStore(clock=vclock, rand=lambda: 0.0), s, monotonic=vclock)


async def turn(p: Pacer, bound: float | None = None, again: bool = False) -> float:
    async with p.permit(A, Klass.PACED, None, None, bound, again) as t:
        return t.waited


async def test_a_permits_own_bound_replaces_max_wait(vclock: VirtualClock) -> None:
    p = pacer(vclock)
    try:
        first = [asyncio.create_task(turn(p)) for _ in range(5)]  # slots 0..4 s: all within 5 s
        await asyncio.sleep(0)
        long = asyncio.create_task(turn(p, bound=55.0))  # slot 5 s: within its 55 s, not within 5 s
        await asyncio.sleep(0)
        started = vclock()
        with pytest.raises(WaitTooLong):
            await turn(p)  # the default bound: refused at once, not held
        assert vclock() - started < 0.1
        assert 4.9 <= await long <= 6.5
        await asyncio.gather(*first)
    finally:
        await p.close()


async def test_a_retry_goes_ahead_of_first_tries(vclock: VirtualClock) -> None:
    p = pacer(vclock, max_wait=30.0)
    try:
        firsts = [asyncio.create_task(turn(p)) for _ in range(6)]
        await asyncio.sleep(0)
        retry = asyncio.create_task(turn(p, again=True))
        waits = await asyncio.gather(*firsts)
        assert await retry <= 2.5  # behind the slot under way, ahead of the five first tries waiting
        assert max(waits) >= 5.5
    finally:
        await p.close()


def test_retries_stand_behind_earlier_retries_and_ahead_of_first_tries() -> None:
    q: QueueState[asyncio.Future[float]] = QueueState()
    loop = asyncio.new_event_loop()
    try:
        made = [Waiter(A, float(i), 99.0, loop.create_future(), again=i in (2, 4)) for i in range(5)]
        for w in made:
            q.add(w)
        order = [w.arrived for w in q.queues[("default", A)]]
        assert order == [2.0, 4.0, 0.0, 1.0, 3.0]
        assert q.agains("default", A) == 2
        # a retry's estimate counts only the retries ahead of it; a first try's, everyone
        assert q.estimate(A, 0.0, 1.0, 0.0, "default", again=True) == 2.0
        assert q.estimate(A, 0.0, 1.0, 0.0, "default") == 5.0
    finally:
        loop.close()


def test_settings_bound_for_uses_the_client_rules() -> None:
    s = PacingSettings(max_wait=25.0, client_rules=(ClientRule("Boto3/", 55.0),))
    assert s.bound_for("Boto3/1.44.8 md/Botocore#1.44.18") == 55.0
    assert s.bound_for("curl/8.5.0") == 25.0 and s.bound_for(None) == 25.0


async def test_every_proxy_on_the_store_says_the_same_of_a_block(vclock: VirtualClock) -> None:
    """One cause, one text (issue 41): a block noted by one proxy is what another proxy's refusals say."""
    from politeproxy.stores.holdnotes import MemoryNotes

    store, notes = MemoryStore(clock=vclock, rand=lambda: 0.0), MemoryNotes()
    s = PacingSettings(gap=0.0, max_wait=5.0, host_intervals=(), retries=0, window_limit=0)
    a, b = (Pacer(store, s, monotonic=vclock, notes=notes) for _ in range(2))
    try:
        async with a.permit(A, Klass.PACED) as t:
            await t.answered(403, None)  # a block: held 120 s
        await asyncio.sleep(0.1)  # the note is written in a task
        with pytest.raises(WaitTooLong) as seen_a:
            await turn(a)
        with pytest.raises(WaitTooLong):
            await turn(b)  # b learns of the hold from the store's answer
        await b.holds.look()  # its watch reads the note of a host it holds
        with pytest.raises(WaitTooLong) as seen_b:
            await turn(b)
        assert seen_a.value.message.startswith(f"{A} is blocked until ")
        assert seen_b.value.message == seen_a.value.message
    finally:
        await a.close()
        await b.close()
