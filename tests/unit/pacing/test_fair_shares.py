"""Fair shares between pipelines (start-time fair queuing over slots), with a fake clock: the pure queue
state hands out slots as the dispatcher would, one per ``gap``, and no loop or sleep is involved. The one
test through the Pacer runs on a virtual clock (tests/support/virtual_clock.py)."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.pacing.base import PacingSettings, WaitTooLong
from politeproxy.pacing.exempt import ExemptPlaces
from politeproxy.pacing.pacer import Pacer
from politeproxy.pacing.state import QueueState, Waiter
from politeproxy.policy.access import Access, basic_credentials
from politeproxy.policy.fairness import (
    FREE_PIPELINES,
    MAX_NAME,
    OTHER_PIPELINE,
    FairTags,
    PipelineNames,
    PipelineRule,
)
from politeproxy.stores.memory import MemoryStore
from tests.support.turns import paced
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

D = "data.commoncrawl.org"
I = "index.commoncrawl.org"  # noqa: E741 - a host, not a number
GAP = 0.2


@dataclass(eq=False)
class Ticket:
    gone: bool = False

    def done(self) -> bool:
        return self.gone


def add(s: QueueState[Ticket], pipeline: str, n: int, at: float, host: str = D) -> list[Waiter[Ticket]]:
    ws = [Waiter(host, at, at + 1000.0, Ticket(), pipeline) for _ in range(n)]
    for w in ws:
        s.add(w)
    return ws


def serve(s: QueueState[Ticket], now: float) -> Waiter[Ticket] | None:
    """One slot, as the dispatcher hands it out: the fair choice, popped and charged."""
    w, _soonest = s.next_line(now)
    if w is None:
        return None
    s.remove(w)
    s.charge(w.pipeline)
    w.ticket.gone = True
    return w


def test_weights_1_1_2_share_25_25_50() -> None:
    s: QueueState[Ticket] = QueueState()
    s.tags.weights = {"c": 2.0}
    for p in ("a", "b", "c"):
        add(s, p, 300, at=0.0)
    got = Counter(w.pipeline for w in (serve(s, i * GAP) for i in range(200)) if w)
    assert got == {"a": 50, "b": 50, "c": 100}  # exact: SFQ over equal-cost slots


def test_a_single_request_goes_next_behind_a_greedy_pipeline() -> None:
    s: QueueState[Ticket] = QueueState()
    add(s, "greedy", 80, at=0.0)
    for i in range(15):  # 3 s of the greedy pipeline alone
        assert serve(s, i * GAP).pipeline == "greedy"  # type: ignore[union-attr]
    # Its estimate is its fair position (nothing ahead), not the 65 greedy requests queued before it.
    assert s.estimate(D, 3.0, GAP, 0.0, "polite") <= GAP
    (single,) = add(s, "polite", 1, at=3.0)
    nxt = serve(s, 3.0)
    assert nxt is single


def test_the_estimate_with_1000_queued_is_the_fair_position() -> None:
    s: QueueState[Ticket] = QueueState()
    add(s, "bulk", 1000, at=0.0)
    serve(s, 0.0)
    assert s.estimate(D, 0.2, GAP, 0.0, "new") < 25.0  # max_wait: not refused
    assert s.estimate(D, 0.2, GAP, 0.0, "new") <= GAP
    # The bulk pipeline's own next request is behind its 999: its estimate stays the whole line.
    assert s.estimate(D, 0.2, GAP, 0.0, "bulk") >= 999 * GAP
    # A newcomer with 10 of its own queued waits about 2 x 10 slots (one each in turn), not 1000.
    add(s, "new", 10, at=0.2)
    est = s.estimate(D, 0.2, GAP, 0.0, "new")
    assert 10 * GAP <= est <= 22 * GAP


def test_the_estimate_for_a_paced_host_counts_only_fair_requests_for_it() -> None:
    s: QueueState[Ticket] = QueueState()
    add(s, "bulk", 100, at=0.0, host=I)
    serve(s, 0.0)
    # index.commoncrawl.org at 1 s per request: the newcomer is 1-2 intervals away, not 100.
    assert s.estimate(I, 0.0, GAP, 1.0, "new") <= 2.0


def test_an_idle_pipeline_banks_nothing() -> None:
    s: QueueState[Ticket] = QueueState()
    add(s, "busy", 500, at=0.0)
    add(s, "quiet", 1, at=0.0)
    for i in range(2):
        serve(s, i * GAP)
    # "quiet" was served once and then stayed idle for 100 slots while "busy" went on alone.
    for i in range(2, 102):
        assert serve(s, i * GAP).pipeline == "busy"  # type: ignore[union-attr]
    add(s, "quiet", 50, at=102 * GAP)
    got = Counter(w.pipeline for w in (serve(s, (102 + i) * GAP) for i in range(20)) if w)
    assert got["quiet"] <= 11  # half the slots (+1 for the tie), never a burst of its 100 idle slots
    assert got["busy"] >= 9


def test_fifo_per_host_within_a_pipeline() -> None:
    s: QueueState[Ticket] = QueueState()
    first = add(s, "a", 3, at=0.0)
    later = add(s, "a", 3, at=1.0)
    add(s, "b", 6, at=0.5)
    served_a = [w for w in (serve(s, i * GAP) for i in range(12)) if w and w.pipeline == "a"]
    assert served_a == first + later


def test_a_host_in_backoff_does_not_hold_its_pipeline_turn() -> None:
    s: QueueState[Ticket] = QueueState()
    add(s, "a", 5, at=0.0, host=I)
    add(s, "b", 5, at=0.0, host=D)
    s.hold(I, 100.0, now=0.0)
    assert {serve(s, i * GAP).pipeline for i in range(5)} == {"b"}  # type: ignore[union-attr]


def test_pipeline_names_are_bounded() -> None:
    names = PipelineNames(configured=["urls"])
    seen = {names.counted_as(f"p{i}") for i in range(200)}
    assert len(seen) == FREE_PIPELINES + 1 and OTHER_PIPELINE in seen
    assert (
        names.counted_as("urls") == "urls"
        and names.counted_as("p0") == "p0"
        and names.counted_as("p199") == OTHER_PIPELINE
    )
    assert PipelineNames().counted_as('bad name"\n') == "bad_name__"


@settings(max_examples=100, deadline=None)
@given(
    weights=st.dictionaries(st.sampled_from("abcd"), st.floats(0.01, 1000.0), max_size=4),
    ops=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 5)), max_size=60),
)
def test_tags_stay_finite_and_bounded(weights: dict[str, float], ops: list[tuple[str, int]]) -> None:
    """Whatever the weights and the order of charges, the tags stay finite, the table holds only the
    pipelines ahead of the virtual time, and ``ahead`` never counts more than is waiting."""
    t = FairTags()
    t.weights = weights
    for p, n in ops:
        t.charge(p)
        assert t.vtime == t.vtime and abs(t.vtime) != float("inf")
        assert all(f > t.vtime for f in t.finish.values()) and len(t.finish) <= 4
        ahead = t.ahead(p, n, {q: n for q in "abcd"})
        assert all(0 <= v <= n for v in ahead.values())


async def test_exempt_places_are_shared_between_pipelines() -> None:
    places = ExemptPlaces(lambda: 4)
    for _ in range(4):  # a long scan holds every place
        await places.acquire(D, "scan")
    scan_more = [asyncio.ensure_future(places.acquire(D, "scan")) for _ in range(20)]
    await asyncio.sleep(0)
    other = asyncio.ensure_future(places.acquire(D, "lookup"))
    await asyncio.sleep(0)
    places.release(D, "scan")  # one of the scan's reads ends: the freed place goes to the other pipeline
    await asyncio.sleep(0)
    assert other.done() and not any(f.done() for f in scan_more)
    assert places.held_by(D, "lookup") == 1 and places.held_by(D, "scan") == 3
    places.release(D, "scan")
    await asyncio.sleep(0)
    assert sum(f.done() for f in scan_more) == 1
    for f in scan_more:
        f.cancel()
    await asyncio.gather(*scan_more, return_exceptions=True)
    assert places.waiting == 0 and places.waiting_by_pipeline == {}


async def test_exempt_places_follow_weights() -> None:
    places = ExemptPlaces(lambda: 3, weights=lambda: {"heavy": 2.0})
    for _ in range(3):
        await places.acquire(D, "first")
    waiters = {p: [asyncio.ensure_future(places.acquire(D, p)) for _ in range(6)] for p in ("light", "heavy")}
    await asyncio.sleep(0)
    for _ in range(3):
        places.release(D, "first")
    await asyncio.sleep(0)
    held = {p: places.held_by(D, p) for p in waiters}
    assert held == {"light": 1, "heavy": 2}
    for fs in waiters.values():
        for f in fs:
            f.cancel()
    await asyncio.gather(*(f for fs in waiters.values() for f in fs), return_exceptions=True)


@settings(max_examples=300, deadline=None)
@given(
    header=st.one_of(
        st.none(), st.text(max_size=300), st.binary(max_size=200).map(lambda b: "Basic " + b.hex())
    )
)
def test_any_proxy_authorization_names_a_bounded_pipeline(header: str | None) -> None:
    """Whatever a client sends as Proxy-Authorization, parsing it never raises, and the pipeline it names
    is a non-empty printable name of at most 64 characters without spaces or quotes (or the address)."""
    creds = basic_credentials(header)
    assert creds is None or (isinstance(creds[0], str) and isinstance(creds[1], str))
    raw = Access([], {}).pipeline(header, "10.0.0.7")
    name = PipelineNames().counted_as(raw)
    assert 0 < len(name) <= MAX_NAME
    assert all(33 <= ord(c) < 127 and c not in "\"'\\" for c in name)


def test_the_user_name_is_the_pipeline() -> None:
    def basic(user: str, pw: str = "") -> str:
        return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()

    open_access = Access([], {})
    assert open_access.pipeline(basic("urls"), "127.0.0.1") == "urls"
    assert open_access.auth_ok(basic("urls", "anything")) and open_access.auth_ok(None)
    assert open_access.pipeline(None, "127.0.0.1") == "127.0.0.1"  # no name: the client's address
    assert open_access.pipeline(basic(""), "127.0.0.1") == "127.0.0.1"
    locked = Access([], {"urls": "pw"})
    assert locked.auth_ok(basic("urls", "pw")) and not locked.auth_ok(basic("urls", "no"))
    assert locked.pipeline(basic("urls", "pw"), "127.0.0.1") == "urls"


async def test_max_queued_refuses_at_once_beyond_the_pipelines_cap(vclock: VirtualClock) -> None:
    settings_ = PacingSettings(gap=10.0, max_wait=100.0, pipelines=(PipelineRule("bulk", max_queued=3),))
    pacer = Pacer(MemoryStore(clock=vclock), settings_, monotonic=vclock)
    held = []
    for _ in range(5):  # one goes at once, one holds the reserved slot, three wait in the line
        held.append(asyncio.ensure_future(paced(pacer, D, pipeline="bulk")))
        await asyncio.sleep(1 / 64)
    assert pacer.snapshot().queued_by_pipeline.get("bulk", 0) == 3 and not held[-1].done()
    assert [f.done() for f in held] == [True, False, False, False, False]
    with pytest.raises(WaitTooLong) as e:
        await paced(pacer, D, pipeline="bulk")
    assert vclock() - T0 == 5 / 64  # refused at once
    assert e.value.reason == "max_queued" and e.value.wait == 3 * 10.0  # its three queued, a gap each
    other = asyncio.ensure_future(paced(pacer, D, pipeline="lookup"))  # another pipeline still queues
    await asyncio.sleep(1 / 16)
    assert not other.done()
    assert pacer.snapshot().queued_by_pipeline.get("lookup", 0) == 1
    for f in [*held, other]:
        f.cancel()
    await asyncio.gather(*held, other, return_exceptions=True)
    await pacer.close()
