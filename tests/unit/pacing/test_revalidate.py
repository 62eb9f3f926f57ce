"""A slot reserved before a throttle was recorded is never handed out inside that backoff.

Two pacers on one store stand for two proxies: one holds a reserved slot for a host, sleeping until it,
when the other records a 503 with Retry-After for that host. The reserved slot must go unused (a gap)
and the waiting request must wait out the backoff (here: refused at its max_wait), never go at once.
"""

from __future__ import annotations

import asyncio

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.classify import Klass
from politeproxy.stores.memory import MemoryStore
from tests.support.turns import paced

HOST = "data.commoncrawl.org"


@pytest.mark.parametrize("same_proxy", [False, True])
async def test_a_reserved_slot_is_not_handed_out_inside_a_later_backoff(same_proxy: bool) -> None:
    store = MemoryStore()
    settings = PacingSettings(gap=0.3, max_wait=0.8)  # the reserved slot (0.3 s) is within max_wait
    a = Pacer(store, settings)
    b = a if same_proxy else Pacer(store, settings)
    try:
        async with a.permit(HOST, Klass.PACED) as first:
            waiting = asyncio.create_task(paced(b, HOST))
            await asyncio.sleep(0.1)  # b's dispatcher has claimed the next slot, 0.3 s after the first
            delay = await first.answered(503, "5")
        assert delay is not None and delay.seconds == 5
        with pytest.raises(WaitTooLong):
            got = await waiting  # before the fix: granted 0.3 s after the first, inside the 5 s backoff
            pytest.fail(f"granted after {got:.2f}s, inside the 5 s backoff")
    finally:
        await a.close()
        await b.close()
