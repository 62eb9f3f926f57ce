"""The pacer reads an answer by its cause (issue 24): an S3 403 or a 404 is an ordinary answer (no hold,
no backoff; it even ends a block, since it came through), CloudFront's 403 and an unknown 403 are blocks,
and /status learns why from the snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from politeproxy.pacing.pacer import Pacer, PacingSettings
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.signals import Cause, Signal
from politeproxy.stores.memory import MemoryStore
from tests.support.virtual_clock import VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
S3 = Signal(Cause.S3_DENIED, "AmazonS3")
CF = Signal(Cause.CLOUDFRONT, "CloudFront")


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(gap=0.125, max_wait=5.0, host_intervals=(), exempt_max_in_flight=16)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
async def store(vclock: VirtualClock) -> MemoryStore:
    return MemoryStore(clock=vclock, rand=lambda: 0.0)


@pytest.fixture
async def pacer(store: MemoryStore, vclock: VirtualClock) -> AsyncIterator[Pacer]:
    p = Pacer(store, settings(throttle_codes=frozenset({404, 429, 503})), monotonic=vclock)
    yield p
    await p.close()


async def test_an_s3_denial_and_a_404_hold_nothing(pacer: Pacer, store: MemoryStore) -> None:
    for _ in range(5):
        assert await pacer._feedback(A, 403, "60", S3) is None
        assert await pacer._feedback(A, 404, None, Signal(Cause.NOT_FOUND)) is None  # even when listed
    view = await store.host_view(A)
    assert (view.backoff_in, view.blocks, view.throttles) == (0.0, 0, 0)
    assert A not in pacer.snapshot().reasons


async def test_cloudfront_and_unknown_403s_block_and_say_why(pacer: Pacer, store: MemoryStore) -> None:
    d = await pacer._feedback(A, 403, None, CF)
    assert d is not None and d.block and (await store.host_view(A)).blocks == 1
    assert pacer.snapshot().reasons[A] == "403 from CloudFront (Server: CloudFront)"
    d = await pacer._feedback(A, 403, None, Signal(Cause.UNKNOWN_403, "nginx"))
    assert d is not None and d.block and (await store.host_view(A)).blocks == 2
    assert pacer.snapshot().reasons[A] == "403 from an unknown server (Server: nginx)"


async def test_a_probe_answered_by_s3_ends_the_block(
    pacer: Pacer, store: MemoryStore, vclock: VirtualClock
) -> None:
    """The denial came through CloudFront: the WAF lets this machine pass again."""
    pacer.reload(settings(backoff=BackoffPolicy(block_hold=1.0, jitter=0.0)))
    assert (d := await pacer._feedback(A, 403, None, CF)) is not None and d.block
    await asyncio.sleep(1.5)  # virtual time
    c = await store.claim(A, 0.0, 0.0, 5.0)  # the probe's grant
    assert c.granted and store.probing(A)
    assert await pacer._feedback(A, 403, None, S3) is None
    view = await store.host_view(A)
    assert (view.blocks, view.backoff_in) == (0, 0.0)
