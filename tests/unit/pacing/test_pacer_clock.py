"""The pacer's timing on a virtual clock (tests/support/virtual_clock.py; issue 22, items 1 and 3): the real
Pacer over the real MemoryStore (and FileStore where marked), exact slot times, orders and counts, each test
in milliseconds of real time.

Every list of grant times is also held to the rule the timing tests use (``assert_paced``): no window of
W seconds holds more than floor(W / gap) + 1 grants on the schedule, plus one grant delivered late.
tests/unit/pacing/test_pacer.py holds the pacer's older cases, on the same clock: refusals for a host's
backoff or a schedule booked by another proxy, cancelled waiters, exempt reads, reloads."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from politeproxy.pacing.base import NoPacerEvents
from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import PipelineRule
from politeproxy.stores.base import Store
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from tests.support.measure import budget_bound, max_in_window
from tests.support.turns import paced
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
B = "commoncrawl.org"
GAP = 0.25  # a binary fraction: every slot T0 + k * GAP is exact
# No jitter and no adaptive interval: the backoffs are the policy's numbers, nothing else moves a slot.
POLICY = BackoffPolicy(base=1.0, factor=2.0, cap=60.0, jitter=0.0, block_hold=8.0, adaptive=False)
WINDOWS = (GAP / 16, GAP / 2, GAP, 1.5 * GAP, 2 * GAP, 3.7 * GAP, 10 * GAP, 41 * GAP)


def settings(**kw: object) -> PacingSettings:
    base: dict[str, object] = dict(gap=GAP, max_wait=100.0, host_intervals=(), backoff=POLICY)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


def since(times: Sequence[float]) -> list[float]:
    return [t - T0 for t in times]


def assert_paced(times: Sequence[float], gap: float = GAP, late: int = 0) -> None:
    """The budget rule: no window of W seconds holds more than floor(W / gap) + 1 grants, plus ``late``
    grants delivered late (a late grant may be followed by the next one on time)."""
    for w in WINDOWS:
        assert max_in_window(times, w) <= budget_bound(1 / gap, w, late * gap), (w, since(times))


class Recorder(NoPacerEvents):
    """PacerEvents that keep each grant's lateness (seconds past its slot)."""

    def __init__(self) -> None:
        self.late: list[float] = []

    def granted(self, host: str, lateness: float, pipeline: str) -> None:
        self.late.append(lateness)


class Grants:
    """Requests sent as tasks through ``pacer.permit``; each grant is logged as (tag, virtual time)."""

    def __init__(self, pacer: Pacer, clock: VirtualClock) -> None:
        self.pacer = pacer
        self.clock = clock
        self.log: list[tuple[str, float]] = []
        self.tasks: list[asyncio.Task[None]] = []

    def send(self, tag: str, host: str = A, pipeline: str | None = None, n: int = 1) -> None:
        self.tasks += [asyncio.create_task(self._one(tag, host, pipeline)) for _ in range(n)]

    async def _one(self, tag: str, host: str, pipeline: str | None) -> None:
        async with self.pacer.permit(host, Klass.PACED, pipeline=pipeline):
            self.log.append((tag, self.clock()))

    def tags(self) -> list[str]:
        return [tag for tag, _t in self.log]

    def times(self, tag: str | None = None) -> list[float]:
        return [t for g, t in self.log if tag is None or g == tag]

    async def drop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def store(vclock: VirtualClock) -> MemoryStore:
    return MemoryStore(clock=vclock, rand=lambda: 0.0)


@pytest.fixture(params=["memory", "file"])
async def any_store(
    request: pytest.FixtureRequest, tmp_path: Path, vclock: VirtualClock
) -> AsyncIterator[Store]:
    """Either store on the virtual clock (the file store keeps its records in ``tmp_path``)."""
    s: Store
    if request.param == "file":
        s = FileStore(tmp_path, clock=vclock, rand=lambda: 0.0)
    else:
        s = MemoryStore(clock=vclock, rand=lambda: 0.0)
    yield s
    await s.close()


@pytest.fixture
async def make_pacer(vclock: VirtualClock) -> AsyncIterator[Callable[..., Pacer]]:
    made: list[Pacer] = []

    def make(store: Store, **kw: object) -> Pacer:
        p = Pacer(store, settings(**kw), Recorder(), monotonic=vclock)
        made.append(p)
        return p

    yield make
    for p in made:
        await p.close()


def lateness(pacer: Pacer) -> list[float]:
    assert isinstance(pacer._events, Recorder)
    return pacer._events.late


# -- the schedule ----------------------------------------------------------------------------------------


async def test_fifo_per_host_one_slot_per_gap(
    any_store: Store, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(any_store)
    g = Grants(pacer, vclock)
    for i in range(12):
        g.send(str(i))
    await asyncio.gather(*g.tasks)
    assert g.tags() == [str(i) for i in range(12)]
    assert since(g.times()) == [k * GAP for k in range(12)]
    assert lateness(pacer) == [0.0] * 12
    assert await any_store.grants() == 12 and pacer.snapshot().grants == 12 and pacer.snapshot().queued == 0
    assert_paced(g.times())


async def test_a_single_request_goes_at_the_next_slot_behind_a_greedy_pipeline(
    store: MemoryStore, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(store)
    g = Grants(pacer, vclock)
    g.send("greedy", pipeline="greedy", n=80)
    # Mid-gap after the 10th grant (slots 0..9): the dispatcher already holds slot 10 for the greedy one.
    await asyncio.sleep(9.5 * GAP)
    g.send("polite", pipeline="polite")
    await asyncio.sleep(4 * GAP)
    assert g.tags()[:14] == ["greedy"] * 11 + ["polite"] + ["greedy"] * 2
    assert since(g.times("polite")) == [11 * GAP]  # the next free slot, not behind the 69 still queued
    assert since(g.times()) == [k * GAP for k in range(14)]
    assert_paced(g.times())
    await g.drop()


async def test_weights_1_1_2_give_30_30_60_of_120_slots(
    store: MemoryStore, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(store, pipelines=(PipelineRule("c", weight=2.0),))
    g = Grants(pacer, vclock)
    for p in ("a", "b", "c"):
        g.send(p, pipeline=p, n=100)
    await asyncio.sleep(119.5 * GAP)  # slots 0..119 granted, the 121st not yet
    assert Counter(g.tags()) == {"a": 30, "b": 30, "c": 60}
    # Start-time fair queuing: per unit of virtual time a, b and c at equal tags (first line first), then
    # c again at the half tag its weight gives.
    assert g.tags() == ["a", "b", "c", "c"] * 30
    assert since(g.times()) == [k * GAP for k in range(120)]
    assert_paced(g.times())
    await g.drop()


# -- backoff ---------------------------------------------------------------------------------------------


async def test_retry_after_holds_the_host_exactly_that_long_and_not_another_host(
    any_store: Store, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(any_store)
    async with pacer.permit(A, Klass.PACED) as p:
        d = await p.answered(503, "2")
    assert d is not None and d.seconds == 2.0
    assert (await any_store.host_view(A)).backoff_in == 2.0
    g = Grants(pacer, vclock)
    g.send("a")  # first in line, but its host rests: the B requests must not queue behind it
    g.send("b", host=B, n=3)
    await asyncio.gather(*g.tasks)
    assert g.tags() == ["b", "b", "b", "a"]
    assert since(g.times("b")) == [GAP, 2 * GAP, 3 * GAP]
    assert since(g.times("a")) == [2.0]  # exactly when the Retry-After ends
    assert_paced([T0, *g.times()])


async def test_exponential_backoff_without_retry_after(
    store: MemoryStore, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(store)
    sent: list[float] = []
    delays: list[float | None] = []
    for status in (503, 503, 503, 200, 503):
        async with pacer.permit(A, Klass.PACED) as p:
            sent.append(vclock())
            d = await p.answered(status, None)
            delays.append(None if d is None else d.seconds)
    assert delays == [1.0, 2.0, 4.0, None, 1.0]  # base x factor^n; a success starts it again
    assert since(sent) == [0.0, 1.0, 3.0, 7.0, 7.0 + GAP]  # each try exactly when the last hold ends
    assert_paced(sent)


async def test_a_block_holds_the_host_then_one_probe_goes_alone(
    store: MemoryStore, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(store)
    async with pacer.permit(A, Klass.PACED) as p:
        d = await p.answered(403, None)
    assert d is not None and d.block and d.seconds == POLICY.block_hold
    probe_answered: list[float] = []

    async def probe() -> None:
        async with pacer.permit(A, Klass.PACED) as p:
            assert store.probing(A)  # the first grant after the hold is the probe
            await asyncio.sleep(0.375)  # its answer comes between two looks (every 0.25 s) of the next
            await p.answered(200, None)
            probe_answered.append(vclock())

    probing = asyncio.create_task(probe())
    g = Grants(pacer, vclock)
    g.send("a")
    g.send("b", host=B, n=2)
    await asyncio.gather(probing, *g.tasks)
    assert since(g.times("b")) == [GAP, 2 * GAP]  # another host is not held
    assert since(probe_answered) == [8.375]
    assert since(g.times("a")) == [8.5]  # the next look after the probe's answer
    assert await store.grants() == 5


# -- max_wait --------------------------------------------------------------------------------------------


async def test_max_wait_refuses_beyond_the_line_with_its_position(
    store: MemoryStore, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(store, max_wait=1.0)
    outcomes: list[tuple[str, float, float]] = []  # (granted | refused, when, waited or estimate)

    async def one() -> None:
        try:
            waited = await paced(pacer, A)
            outcomes.append(("granted", vclock() - T0, waited))
        except WaitTooLong as e:
            outcomes.append(("refused", vclock() - T0, e.wait))

    await asyncio.gather(*(one() for _ in range(8)))
    # The k-th in line waits k gaps: up to 1.0 s fits max_wait (the last goes on its deadline exactly).
    # The others are refused at once with the wait of the place they would take: 5 gaps (none joins).
    assert (
        sorted(outcomes)
        == [("granted", k * GAP, k * GAP) for k in range(5)] + [("refused", 0.0, 5 * GAP)] * 3
    )
    assert await store.grants() == 5  # a refused request spent no slot


# -- retries ---------------------------------------------------------------------------------------------

RETRY_CASES = [
    # statuses answered in turn, Retry-After, max_wait -> when each try was sent, why the last was final
    ((503, 200), "3", 100.0, [0.0, 3.0], "not a throttle"),  # when the host's Retry-After ends
    ((503, 200), "0", 100.0, [0.0, 1.0], "not a throttle"),  # never sooner than MIN_RETRY_GAP
    ((503, 503, 503), "2", 100.0, [0.0, 2.0, 4.0], "no retries left"),  # pacing.retries = 2
    ((503,), "30", 25.0, [0.0], "would exceed max_wait"),
    ((403,), None, 100.0, [0.0], "a block is never retried"),
]


@pytest.mark.parametrize(("statuses", "retry_after", "max_wait", "sent_at", "why"), RETRY_CASES)
async def test_retries_wait_out_the_backoff_through_the_pacer(
    store: MemoryStore,
    make_pacer: Callable[..., Pacer],
    vclock: VirtualClock,
    statuses: tuple[int, ...],
    retry_after: str | None,
    max_wait: float,
    sent_at: list[float],
    why: str,
) -> None:
    """The forwarder's loop (proxy/forwarding/forward.py): a permit, the answer, the permit's retry decision,
    a sleep, a permit."""
    pacer = make_pacer(store, max_wait=max_wait, retries=2)
    arrived, retried, sent = vclock(), 0, []
    answers = iter(statuses)
    while True:
        async with pacer.permit(A, Klass.PACED, arrived) as p:
            sent.append(vclock())
            await p.answered(next(answers), retry_after)
            decision = p.retry("GET", False, retried)
        if not decision.retry:
            break
        retried += 1
        await asyncio.sleep(decision.after)
    assert since(sent) == sent_at and decision.why == why
    assert_paced(sent)


# -- late grants (issue 22, item 3) ----------------------------------------------------------------------


async def test_a_late_grant_keeps_the_schedule_and_the_next_goes_on_time(
    any_store: Store, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(any_store)
    g = Grants(pacer, vclock)
    g.send("r", n=6)
    # The loop is blocked for one gap from 1/64 s before slot 2: that grant goes 15/16 of a gap late.
    await asyncio.sleep(2 * GAP - 1 / 64)
    vclock.busy(GAP)
    await asyncio.gather(*g.tasks)
    late = 2 * GAP - 1 / 64 + GAP
    assert since(g.times()) == [0.0, GAP, late, 3 * GAP, 4 * GAP, 5 * GAP]  # slot 3 on time, 1/64 s on
    assert lateness(pacer) == [0.0, 0.0, late - 2 * GAP, 0.0, 0.0, 0.0]
    # The strict rule fails by one, the late grant's: two grants in 1/64 s ...
    assert max_in_window(g.times(), 0.02) == 2 > math.floor(0.02 / GAP) + 1
    assert_paced(g.times(), late=1)  # ... and one is all it ever adds


async def test_a_grant_later_than_a_gap_does_not_replay_the_missed_slots(
    store: MemoryStore, make_pacer: Callable[..., Pacer], vclock: VirtualClock
) -> None:
    pacer = make_pacer(store)
    g = Grants(pacer, vclock)
    g.send("r", n=6)
    await asyncio.sleep(2 * GAP - 1 / 64)
    vclock.busy(2.5 * GAP)  # slot 2 goes 2.4 gaps late; slot 3 passed unused meanwhile
    await asyncio.gather(*g.tasks)
    late = 2 * GAP - 1 / 64 + 2.5 * GAP
    # The next slot is "now" (the passed ones are gone, not a burst), then the schedule goes on from it.
    assert since(g.times()) == [0.0, GAP, late, late, late + GAP, late + 2 * GAP]
    assert lateness(pacer) == [0.0, 0.0, late - 2 * GAP, 0.0, 0.0, 0.0]
    assert_paced(g.times(), late=1)
