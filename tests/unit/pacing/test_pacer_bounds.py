"""Issue 9 items of the pacer, in process: feedback survives cancellation (5), bounded tables and labels (9),
metrics memory without scrapes (15), a bounded queue (21), a dispatcher that neither floods the log nor spins
on a store error (24), and the exempt places. Real asyncio on a virtual clock (tests/support/virtual_clock.py)
and a MemoryStore; a store that fails or stalls is a small subclass, as the store is the unit's dependency.
Items 9 and 21 through a real proxy are in tests/e2e/test_pacing_hardening.py."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
import tracemalloc
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from politeproxy.observe import metrics as metrics_mod
from politeproxy.observe.metricparts import FREE_HOST_LABELS, PINNED_HOSTS
from politeproxy.observe.metrics import Metrics
from politeproxy.pacing import pacer as pacer_mod
from politeproxy.pacing.base import NoPacerEvents
from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import DEFAULT_PIPELINE
from politeproxy.stores.base import StoreError
from politeproxy.stores.memory import MemoryStore
from tests.support.proxyio import host_labels
from tests.support.turns import paced
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
TABLE_CAP = 256  # what the pacer promises for any per-host table (state.HINT_CAP)


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(
        gap=1 / 64, max_wait=5.0, host_intervals=(), backoff=BackoffPolicy(jitter=0)
    )
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


class SlowStore(MemoryStore):
    """Each throttle write takes ``hold`` seconds: the window in which a client may leave."""

    def __init__(self, hold: float, clock: VirtualClock) -> None:
        super().__init__(clock=clock, rand=lambda: 0.0)
        self.hold = hold

    async def throttled(self, host: str, retry_after: float | None, policy: BackoffPolicy, *rest):  # type: ignore[no-untyped-def]
        await asyncio.sleep(self.hold)
        return await super().throttled(host, retry_after, policy, *rest)


class BrokenStore(MemoryStore):
    """Claims raise while ``broken``; each message carries a different number, as real ones do."""

    def __init__(self, clock: VirtualClock, exc: type[Exception] = StoreError) -> None:
        super().__init__(clock=clock, rand=lambda: 0.0)
        self.broken = True
        self.claims = 0
        self.exc = exc

    async def claim(self, host: str, gap: float, interval: float, max_wait: float | None, *a, **kw):  # type: ignore[no-untyped-def]
        self.claims += 1
        if self.broken:
            raise self.exc(f"ratelimit.lock: bad record {self.claims * 7919} at offset {self.claims}")
        return await super().claim(host, gap, interval, max_wait)


class Recorder(NoPacerEvents):
    """PacerEvents that remember the rejections."""

    def __init__(self) -> None:
        self.rejections: list[tuple[str, str]] = []

    def rejected(self, host: str, reason: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        self.rejections.append((host, reason))


@pytest.fixture
async def closing() -> AsyncIterator[list[Pacer]]:
    made: list[Pacer] = []
    yield made
    for p in made:
        await p.close()


# -- item 5: feedback survives the caller's cancellation -------------------------------------------------


async def test_a_throttle_is_recorded_although_the_client_left_during_answered(
    closing: list[Pacer], vclock: VirtualClock
) -> None:
    store = SlowStore(0.25, vclock)
    pacer = Pacer(store, settings(), monotonic=vclock)
    closing.append(pacer)
    started = asyncio.Event()

    async def client() -> None:
        async with pacer.permit(A, Klass.PACED) as p:
            started.set()
            await p.answered(429, "30")

    task = asyncio.create_task(client())
    await started.wait()
    await asyncio.sleep(1 / 16)  # answered() runs; the store write is in flight
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await store.host_view(A)).throttles == 0  # not yet written when the client left
    await asyncio.sleep(0.25)
    view = await store.host_view(A)
    assert view.throttles == 1
    assert view.backoff_in == T0 + 0.25 + 30 - vclock()  # the Retry-After: 30 holds from the write


async def test_close_waits_for_feedback_in_flight(vclock: VirtualClock) -> None:
    store = SlowStore(0.25, vclock)
    pacer = Pacer(store, settings(), monotonic=vclock)
    async with pacer.permit(A, Klass.PACED) as p:
        task = asyncio.create_task(p.answered(503, "20"))
        await asyncio.sleep(1 / 64)
        task.cancel()
    await pacer.close()  # shutdown right after the client left: the throttle must still be written
    assert vclock() - T0 == 0.25  # close() returned when the write did
    assert (await store.host_view(A)).throttles == 1


async def test_close_is_bounded_when_a_feedback_write_hangs(vclock: VirtualClock) -> None:
    pacer = Pacer(SlowStore(3600.0, vclock), settings(), monotonic=vclock)
    async with pacer.permit(A, Klass.PACED) as p:
        task = asyncio.create_task(p.answered(503, None))
        await asyncio.sleep(1 / 64)
        task.cancel()
    t0 = vclock()
    await pacer.close()
    assert vclock() - t0 == pacer_mod.FEEDBACK_CLOSE_TIMEOUT  # bounded, not the store's hour
    leftover = [t for t in asyncio.all_tasks() if "record" in repr(t.get_coro())]
    assert not leftover, "a feedback task outlived close()"


# -- item 9: 500 names leave bounded tables and bounded label series -------------------------------------


def table_sizes(*objs: object) -> dict[str, int]:
    """Every dict, set and deque held by the given objects (one level down), by attribute name."""
    sizes = {}
    for obj in objs:
        for name, value in vars(obj).items():
            if isinstance(value, dict | set | deque):
                sizes[f"{type(obj).__name__}.{name}"] = len(value)
    return sizes


async def test_500_names_leave_bounded_tables_and_label_series(
    closing: list[Pacer], vclock: VirtualClock
) -> None:
    metrics = Metrics()
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)  # virtual: 500 paced slots cost no real time
    pacer = Pacer(store, settings(exempt_respect_backoff=False), metrics, monotonic=vclock)
    closing.append(pacer)
    names = [f"n{i}.commoncrawl.org" for i in range(500)]
    for host in names:
        async with pacer.permit(host, Klass.PACED) as p:
            await p.answered(503, "60")  # every name ends in a backoff this process remembers
        metrics.answered(host, "paced", 503)
        async with pacer.permit(host, Klass.EXEMPT) as p:
            await p.answered(200, None)
        metrics.answered(host, "exempt", 200)
    assert pacer.snapshot().queued == 0
    parts = [getattr(pacer, name) for name in ("state", "places", "dispatcher") if hasattr(pacer, name)]
    sizes = table_sizes(pacer, *parts)
    assert max(sizes.values()) <= TABLE_CAP, sizes
    assert len(pacer.snapshot().hosts) <= TABLE_CAP
    labels = host_labels(metrics.render().decode())
    assert len(labels) <= len(PINNED_HOSTS) + FREE_HOST_LABELS + 1, len(labels)
    assert "other" in labels


async def test_pinned_hosts_keep_their_label_and_other_sums_its_hosts() -> None:
    m = Metrics()
    getattr(m, "pin_hosts", lambda _hosts: None)(["commoncrawl.s3.amazonaws.com"])  # the configured host
    for i in range(FREE_HOST_LABELS):
        m.granted(f"early{i}.commoncrawl.org", 0.0, "default")
    for host in (*PINNED_HOSTS, "commoncrawl.s3.amazonaws.com"):
        m.granted(host, 0.0, "default")
    m.line_changed("late1.commoncrawl.org", "default", 3)
    m.line_changed("late2.commoncrawl.org", "default", 4)
    m.line_changed("late1.commoncrawl.org", "default", 0)
    text = m.render().decode()
    assert {*PINNED_HOSTS, "commoncrawl.s3.amazonaws.com"} <= host_labels(text)
    assert "late1.commoncrawl.org" not in text
    assert 'politeproxy_queue_depth{host="other",pipeline="default"} 4.0' in text  # late2's 4, late1's 0


# -- item 15: metrics memory without a scrape --------------------------------------------------------------


def test_grants_without_a_scrape_keep_metrics_memory_flat() -> None:
    now = [1000.0]
    m = Metrics(clock=lambda: now[0])
    window = metrics_mod.RATE_WINDOW

    def grants(n: int) -> None:
        for _ in range(n):  # 100 grants/s, never scraped
            now[0] += 0.01
            m.granted(A, 0.0, "default")

    grants(int(window * 100) + 1000)  # fill a whole window first: what a steady rate keeps
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        grants(30_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, f"{grown} more bytes kept after 30k more grants"
    rate = re.search(r'politeproxy_achieved_rate\{scope="global"\} (\S+)', m.render().decode())
    assert rate is not None
    assert float(rate.group(1)) == pytest.approx(100.0, rel=0.02)


# -- item 21: every queue is bounded -----------------------------------------------------------------------


async def test_waiters_beyond_the_cap_are_refused_at_once(closing: list[Pacer], vclock: VirtualClock) -> None:
    events = Recorder()
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    # Pacing off and the host backing off: nothing but the cap limits the line.
    settings_ = settings(gap=0.0, max_wait=20.0, exempt_max_in_flight=1)
    pacer = Pacer(store, settings_, events, monotonic=vclock)
    closing.append(pacer)
    await pacer._record(A, 503, 10.0)
    n = pacer_mod.DEFAULT_MAX_QUEUE if hasattr(pacer_mod, "DEFAULT_MAX_QUEUE") else 1024
    tasks = [asyncio.create_task(paced(pacer, A)) for _ in range(n + 76)]
    await asyncio.sleep(0)  # each task's first step: queued, or refused
    assert vclock() == T0  # refused at once, not after max_wait
    refused = [t for t in tasks if t.done()]
    assert pacer.snapshot().queued == n
    assert len(refused) == 76
    for t in refused:
        e = t.exception()
        assert isinstance(e, WaitTooLong) and e.reason == "queue_full" and e.wait >= 1.0
    assert events.rejections.count((A, "queue_full")) == 76
    # Exempt reads that would have to wait count too; one with a free place does not wait.
    other = "index.commoncrawl.org"
    async with pacer.permit(other, Klass.EXEMPT):
        with pytest.raises(WaitTooLong) as e:
            async with pacer.permit(other, Klass.EXEMPT):
                pass
    assert e.value.reason == "queue_full"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert pacer.snapshot().queued == 0


# -- item 24: a persistent dispatcher error -----------------------------------------------------------------


@pytest.mark.parametrize("exc", [StoreError, RuntimeError])
async def test_a_failing_store_logs_once_and_the_dispatcher_backs_off(
    exc: type[Exception], caplog: pytest.LogCaptureFixture, closing: list[Pacer], vclock: VirtualClock
) -> None:
    caplog.set_level(logging.INFO, logger="politeproxy")
    store = BrokenStore(vclock, exc)
    pacer = Pacer(store, settings(max_wait=10.0), monotonic=vclock)
    closing.append(pacer)
    waiter = asyncio.create_task(paced(pacer, A))
    await asyncio.sleep(1.6)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # one line; repeats are counted, not logged
    assert sum(r.exc_info is not None for r in errors) == (0 if exc is StoreError else 1)
    # Backing off 0.1, 0.2, 0.4, 0.8 s: claims at 0, 0.1, 0.3, 0.7 and 1.5 s, where a fixed 0.1 s retry
    # made 16; the next at 3.1 s (after 1.6 s more).
    assert store.claims == 5
    store.broken = False
    assert await waiter == pytest.approx(3.1, abs=1e-6)  # the loop's clock counts whole microseconds
    assert store.claims == 6
    assert any("recovered" in r.getMessage() for r in caplog.records)


# On the real clock: another open file description holds a real flock, and the store waits for it in a real
# thread against time.monotonic() (stores/flock.py, LockWait); virtual time would not move that thread.
@pytest.mark.slow  # holds the lock 2 s, then waits for the recovery
async def test_a_file_store_locked_elsewhere_logs_one_line_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, closing: list[Pacer]
) -> None:
    """The same with a real FileStore whose ratelimit.lock another holder keeps flocked."""
    from politeproxy.stores.file import FileStore

    caplog.set_level(logging.INFO, logger="politeproxy")
    store = FileStore(tmp_path)
    store.lock_timeout = 0.1  # each claim gives up after 0.1 s instead of 5 s
    holder = os.open(tmp_path / "ratelimit.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file description: the store's own flock blocks
    pacer = Pacer(store, settings(max_wait=15.0))
    closing.append(pacer)
    try:
        waiter = asyncio.create_task(paced(pacer, A))
        await asyncio.sleep(2.0)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "ratelimit.lock" in errors[0], errors
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
    async with asyncio.timeout(6.0):
        await waiter
    assert await store.grants() == 1
    await store.close()


# -- the exempt places (issue 10's small resizable semaphore) ------------------------------------------------


async def test_an_exempt_place_handed_to_a_waiter_that_left_passes_on() -> None:
    from politeproxy.pacing.exempt import ExemptPlaces

    limit = [1]
    places = ExemptPlaces(lambda: limit[0])
    await places.acquire(A)
    first = asyncio.create_task(places.acquire(A))
    second = asyncio.create_task(places.acquire(A))
    await asyncio.sleep(0.01)
    assert places.waiting == 2
    places.release(A)  # hands the place to the first waiter ...
    first.cancel()  # ... which leaves before it runs: the place must go to the second
    await asyncio.sleep(0.01)
    assert second.done() and first.cancelled()
    assert places.in_flight(A) == 1 and places.waiting == 0
    places.release(A)
    assert places.snapshot() == {}  # an idle host keeps no entry
    # Resizing lets waiters in at once.
    holders = [asyncio.create_task(places.acquire(A)) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert places.in_flight(A) == 1
    limit[0] = 3
    places.resize()
    await asyncio.sleep(0.01)
    assert all(t.done() for t in holders) and places.in_flight(A) == 3


async def test_an_exempt_read_survives_a_store_that_cannot_answer(
    closing: list[Pacer], vclock: VirtualClock
) -> None:
    class NoView(MemoryStore):
        async def host_view(self, host: str):  # type: ignore[no-untyped-def]
            raise StoreError("redis: connection refused")

    store = NoView(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, settings(), monotonic=vclock)
    closing.append(pacer)
    async with pacer.permit(A, Klass.EXEMPT) as p:  # no backoff known anywhere: it goes
        await p.answered(503, "1")  # the store records it; the local hint holds it too
    async with pacer.permit(A, Klass.EXEMPT) as p:
        assert p.waited == 1.0 == vclock() - T0  # the backoff still applied, exactly
