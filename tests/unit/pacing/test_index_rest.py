"""Issue 43 item 3 on a virtual clock: after a warning from the index server (503, 502, 504, or no answer)
no request goes to it for pacing.index_rest (60 s by default) or the answer's Retry-After if longer, a later
warning doubles it, and every proxy sharing the store rests it too (the real Pacer over the real stores)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from politeproxy.pacing.base import NoPacerEvents
from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.stores.base import Store
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from tests.support.virtual_clock import VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

IX = "index.commoncrawl.org"
DATA = "data.commoncrawl.org"
POLICY = BackoffPolicy(jitter=0.0, adaptive=False)  # the defaults otherwise: a 1 s first backoff


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(gap=0.25, max_wait=500.0, host_intervals=(), backoff=POLICY, retries=0)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, vclock: VirtualClock) -> AsyncIterator[Store]:
    s: Store = (
        FileStore(tmp_path, clock=vclock, rand=lambda: 0.0)
        if request.param == "file"
        else MemoryStore(clock=vclock, rand=lambda: 0.0)
    )
    yield s
    await s.close()


async def answer(pacer: Pacer, host: str, status: int | None, retry_after: str | None = None) -> float:
    """One request to ``host`` answered ``status``: the rest the pacer applied."""
    async with pacer.permit(host, Klass.PACED) as p:
        d = await p.answered(status, retry_after, None)
    return d.seconds if d is not None else 0.0


async def granted_at(pacer: Pacer, host: str, vclock: VirtualClock) -> float:
    async with pacer.permit(host, Klass.PACED):
        return vclock()


async def test_a_503_rests_the_index_60s_and_a_later_one_120s(store: Store, vclock: VirtualClock) -> None:
    pacer = Pacer(store, settings(), NoPacerEvents(), monotonic=vclock)
    other = Pacer(store, settings(), NoPacerEvents(), monotonic=vclock)  # a second proxy on the store
    try:
        assert await answer(pacer, IX, 503) == 60.0  # the default, though today's first backoff is 1 s
        t0 = vclock()
        # No request reaches the index for 60 s, from this proxy or another sharing the store
        assert await granted_at(other, IX, vclock) - t0 >= 60.0
        assert await answer(pacer, IX, 503) == 120.0  # the second warning in a row doubles it
        t1 = vclock()
        assert await granted_at(pacer, IX, vclock) - t1 >= 120.0
        assert pacer.snapshot().reasons[IX].endswith("the index server rests 120s")
        assert await answer(pacer, IX, 200) == 0.0  # a success: the count starts again
        assert await answer(pacer, IX, None) == 60.0  # a reset or empty reply is a warning too
        await granted_at(pacer, IX, vclock)
        assert await answer(pacer, IX, 200) == 0.0
        assert await answer(pacer, IX, 504, "90") == 90.0  # a longer Retry-After wins
    finally:
        await pacer.close()
        await other.close()


async def test_the_rest_refuses_within_max_wait_and_other_services_back_off_as_before(
    store: Store, vclock: VirtualClock
) -> None:
    pacer = Pacer(store, settings(max_wait=25.0), NoPacerEvents(), monotonic=vclock)
    try:
        assert await answer(pacer, IX, 502) == 60.0
        with pytest.raises(WaitTooLong) as e:  # a question that would wait past its hold bound
            await granted_at(pacer, IX, vclock)
        assert e.value.wait > 25.0
        assert await answer(pacer, DATA, 503) == 1.0  # not the index: today's backoff
        assert await answer(pacer, DATA, 502) == 0.0  # not a throttle code for the data service
    finally:
        await pacer.close()


async def test_the_rest_is_a_setting(store: Store, vclock: VirtualClock) -> None:
    short = Pacer(store, settings(index_rest=2.0), NoPacerEvents(), monotonic=vclock)
    try:
        assert await answer(short, IX, 503) == 2.0
    finally:
        await short.close()
    off = Pacer(store, settings(index_rest=0.0), NoPacerEvents(), monotonic=vclock)
    try:
        await granted_at(off, IX, vclock)
        assert await answer(off, IX, 502) == 0.0  # off: a 502 is not a throttle code
    finally:
        await off.close()
