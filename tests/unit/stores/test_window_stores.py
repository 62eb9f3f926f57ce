"""The request window in the stores (issue 24 item 1): whatever the mix of grants, paced (``claim``) and
exempt (``exempt_claim``), from one proxy or two sharing a backend (two FileStore on one directory; two
RedisStore on one server with one prefix and one egress name; the MemoryStore alone), no trailing window of
a service holds more than its limit of granted slots. Then untrusted records: a window file of any bytes
and a window hash of any fields never raise and hold the service for a bounded time.

Memory and file stores run on an injected clock; Redis counts on the server's TIME, so its property runs in
real time with a 1 s window and few examples.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import struct
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from politeproxy.policy.services import service_key
from politeproxy.policy.slots import Claim
from politeproxy.policy.window import AHEAD, EPSILON, WindowRule, WindowState
from politeproxy.stores import window_records
from politeproxy.stores.base import Store, StoreError
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.store_helpers import T0, Clock

redis_one = redis_fixture("redis_one", scope="module")  # the system redis-server

EGRESS = "nat-a"
# Two services: the data distribution, and the bucket under three of its names (one window for all three).
HOSTS = (
    "data.commoncrawl.org",
    "commoncrawl.s3.amazonaws.com",
    "commoncrawl.s3.us-east-1.amazonaws.com",
    "commoncrawl.s3.dualstack.us-east-1.amazonaws.com",
)
# The schedule and the exempt ceiling let far more through than the window: the window is what binds.
GAP = 0.05  # paced: 20/s globally
RATE, BURST = 0.02, 8  # exempt: 50/s after a burst of 8
MAX_WAIT = 1.0  # a paced slot may be reserved up to a second ahead


def rule_for(host: str, seconds: float, limit: int) -> WindowRule:
    return WindowRule(service_key(host), EGRESS, seconds, limit)


def most_in_a_window(times: list[float], seconds: float) -> int:
    """The most of ``times`` a closed window [t, t + seconds] holds (the busiest starts on one of them)."""
    ts = sorted(times)
    return max((bisect.bisect_right(ts, t + seconds) - i for i, t in enumerate(ts)), default=0)


async def grant(store: Store, host: str, klass: str, rule: WindowRule) -> Claim:
    if klass == "paced":
        return await store.claim(host, GAP, 0.0, MAX_WAIT, window=rule)
    return await store.exempt_claim(host, RATE, BURST, MAX_WAIT, True, service_key(host), rule)


# One step: milliseconds to move the clock on, which proxy, which class, which host.
steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=700),
        st.integers(min_value=0, max_value=1),
        st.sampled_from(["paced", "exempt"]),
        st.integers(min_value=0, max_value=len(HOSTS) - 1),
    ),
    min_size=1,
    max_size=60,
)


async def _run_clocked(stores: list[Store], clock: Clock, seq: list[tuple[int, int, str, int]]) -> None:
    seconds, limit = 2.0, 5
    slots: dict[str, list[float]] = {}
    for ms, proxy, klass, h in seq:
        clock.t += ms / 1000
        host = HOSTS[h]
        rule = rule_for(host, seconds, limit)
        c = await grant(stores[proxy % len(stores)], host, klass, rule)
        if c.granted:
            slots.setdefault(rule.service, []).append(c.at)  # the slot, in the stores' (shared) clock
        else:
            assert c.wait > 0
    for service, ts in slots.items():
        # The window plus LATE: arrivals up to LATE after their slots never overfill a window either.
        reach = rule_for(HOSTS[0], seconds, limit).reach
        assert most_in_a_window(ts, reach) <= limit, (service, [round(t - T0, 3) for t in sorted(ts)])
    for s in stores:
        await s.close()


@settings(max_examples=150, deadline=None)
@given(steps)
def test_memory_store_never_exceeds_the_window(seq: list[tuple[int, int, str, int]]) -> None:
    clock = Clock()
    asyncio.run(_run_clocked([MemoryStore(clock=clock)], clock, seq))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_two_file_stores_on_one_dir_never_exceed_the_window(seq: list[tuple[int, int, str, int]]) -> None:
    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[Store] = [FileStore(Path(tmp), clock=clock), FileStore(Path(tmp), clock=clock)]
        asyncio.run(_run_clocked(stores, clock, seq))


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 0, 0, 10, 30, 80, 150]),  # ms to sleep: bursts, and gaps that let buckets go
            st.integers(min_value=0, max_value=1),
            st.sampled_from(["paced", "exempt"]),
            st.integers(min_value=0, max_value=len(HOSTS) - 1),
        ),
        min_size=5,
        max_size=40,
    )
)
def test_two_redis_stores_of_one_egress_never_exceed_the_window(
    redis_one: RedisServer, seq: list[tuple[int, int, str, int]]
) -> None:
    asyncio.run(_run_redis(redis_one, seq))


# A slot's time as measured: a paced slot comes back in the server's clock (exact); an exempt one as
# Claim.at, the local time the answer arrived plus its wait, which is late by the round trip at most
# (same machine, same clock). Windows of reach - AT_LATE over the measured times then hold at most what
# windows of reach hold over the true ones.
AT_LATE = 0.05


async def _run_redis(server: RedisServer, seq: list[tuple[int, int, str, int]]) -> None:
    seconds, limit = 1.0, 5
    prefix = f"pp-win-{uuid.uuid4().hex[:8]}:"  # a fresh budget per example
    stores = [RedisStore(server.url, prefix=prefix), RedisStore(server.url, prefix=prefix)]
    slots: dict[str, list[float]] = {}
    try:
        for ms, proxy, klass, h in seq:
            await asyncio.sleep(ms / 1000)
            host = HOSTS[h]
            rule = rule_for(host, seconds, limit)
            store = stores[proxy]
            if klass == "paced":
                c, at = await store.claim_with_server_time(host, GAP, 0.0, MAX_WAIT, window=rule)
            else:
                c = await grant(store, host, klass, rule)
                at = c.at
            if c.granted:
                slots.setdefault(rule.service, []).append(at)
        for service, ts in slots.items():
            got = most_in_a_window(ts, rule_for(HOSTS[0], seconds, limit).reach - AT_LATE)
            assert got <= limit, (service, [round(t - min(ts), 3) for t in sorted(ts)])
    finally:
        for s in stores:
            await s.close()


# -- each store: a full window refuses, and says so ------------------------------------------------------


@pytest.fixture(params=["memory", "file", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    if request.param == "memory":
        one = MemoryStore()  # one process: both "proxies" are the one store
        return lambda: one
    if request.param == "file":
        return lambda: FileStore(tmp_path)
    server: RedisServer = request.getfixturevalue("redis_one")
    prefix = f"pp-win-{uuid.uuid4().hex[:8]}:"
    return lambda: RedisStore(server.url, prefix=prefix)


async def test_a_full_window_refuses_every_class_and_reserves_nothing(make_store: object) -> None:
    a, b = make_store(), make_store()  # type: ignore[operator]
    rule = rule_for(HOSTS[1], 60.0, 3)
    try:
        assert (await a.claim(HOSTS[1], 0.0, 0.0, 5.0, window=rule)).granted
        assert (await b.exempt_claim(HOSTS[2], RATE, BURST, 5.0, True, HOSTS[1], rule)).granted
        assert (await a.exempt_claim(HOSTS[3], RATE, BURST, 5.0, True, HOSTS[1], rule)).granted
        assert await b.window_used(rule) == 3
        for c in (
            await a.claim(HOSTS[1], 0.0, 0.0, 5.0, window=rule),
            await a.exempt_claim(HOSTS[2], RATE, BURST, 5.0, True, HOSTS[1], rule),
        ):
            assert not c.granted and c.window and c.wait > 50, c
        # The other service has its own window; and the refusals reserved nothing: no paced slot moved.
        other = rule_for(HOSTS[0], 60.0, 3)
        c = await a.claim(HOSTS[0], 0.0, 0.0, 5.0, window=other)
        assert c.granted and c.wait < 0.5
    finally:
        await a.close()
        await b.close()


async def test_a_refused_paced_claim_leaves_the_schedule_as_it_was() -> None:
    clock = Clock()
    s = MemoryStore(clock=clock)
    rule = rule_for(HOSTS[0], 60.0, 1)
    assert (await s.claim(HOSTS[0], 10.0, 0.0, 5.0, window=rule)).granted
    before = s.global_next
    assert (await s.claim(HOSTS[0], 10.0, 0.0, 30.0, window=rule)).window
    assert s.global_next == before and s.count == 1


# -- the file store ---------------------------------------------------------------------------------------


async def test_a_window_of_fractional_seconds_drains_in_the_file_store(tmp_path: Path) -> None:
    """1.1 s: its bucket width does not survive the record's nanoseconds exactly. A request every 0.5 s is
    at most 5 in any 2.1 s (the window plus LATE), the limit, so every one is granted. (Read back as a
    reload, every count was folded into the newest bucket on each claim and the window never drained.)"""
    clock = Clock()
    s = FileStore(tmp_path, clock=clock)
    rule = rule_for(HOSTS[0], 1.1, 5)
    try:
        for k in range(20):
            c = await s.claim(HOSTS[0], 0.0, 0.0, 0.0, window=rule)
            assert c.granted, (k, c)
            clock.t += 0.5
    finally:
        await s.close()


def _record_bytes() -> st.SearchStrategy[bytes]:
    """Any bytes, and records with the right magic and any width, length and buckets."""
    head = st.builds(
        lambda w, n: window_records.HEAD.pack(window_records.MAGIC, w, n),
        st.one_of(st.just(40_000_000), st.integers(0, 2**64 - 1)),  # 40 ms: the 2 s window's own width
        st.integers(0, window_records.MAX_KEPT + 3),
    )
    near = round(T0 / 0.04)
    bucket = st.builds(
        lambda i, c: struct.pack(">qI", i, c),
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(near - 100, near + 200)),
        st.one_of(st.integers(0, 2**32 - 1), st.integers(1, 5)),
    )
    framed = st.builds(lambda h, b: h + b"".join(b), head, st.lists(bucket, max_size=160))
    return st.one_of(st.binary(max_size=window_records.SIZE + 64), framed)


@pytest.mark.slow  # hypothesis over window files: ~2-3 s
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_record_bytes(), st.sampled_from(["paced", "exempt"]))
def test_any_window_file_never_raises_and_holds_one_window_at_most(data: bytes, klass: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_corrupt_file(Path(tmp), data, klass))


async def _corrupt_file(tmp: Path, data: bytes, klass: str) -> None:
    clock = Clock()
    s = FileStore(tmp, clock=clock)
    rule = rule_for(HOSTS[0], 2.0, 5)
    try:
        (tmp / "windows" / "data.commoncrawl.org").write_bytes(data)
        c = await grant(s, HOSTS[0], klass, rule)
        assert math.isfinite(c.wait) and c.wait >= 0
        assert 0 <= await s.window_used(rule) <= 10_000_000
        # A legitimate record reaches AHEAD buckets past now; a corrupt one is bounded to that, so one
        # window after it the service is free again.
        clock.t += (AHEAD + 1) * rule.width + rule.reach + 2 * EPSILON
        assert (await grant(s, HOSTS[0], klass, rule)).granted
        assert len((tmp / "windows" / "data.commoncrawl.org").read_bytes()) <= window_records.SIZE
    finally:
        await s.close()


def test_window_records_round_trip() -> None:
    from politeproxy.policy.window import WindowState

    state = WindowState(6.0, ((1, 2), (5, 7)))
    assert window_records.decode(window_records.encode(state)) == (state, True)
    assert window_records.decode(b"") == (WindowState(), True)
    assert window_records.decode(b"PPW1") == (WindowState(), False)


# -- the Redis store: stray fields in the window hash --------------------------------------------------------

fields = st.dictionaries(
    st.one_of(
        st.text(max_size=12),
        st.just("w"),
        st.sampled_from(["nan", "inf", "-inf", "1e400", "0x10", "16.5", "-3", "99999999999999999999"]),
    ),
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(["nan", "inf", "-1", "0", "1e300", "20000", "5", "2.5", "0x7fffffff"]),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields, st.sampled_from(["paced", "exempt"]))
def test_stray_window_fields_never_raise(server: RedisServer, garbage: dict[str, str], klass: str) -> None:
    """On every server kind (Redis 7, Redis 6.2, Valkey: ``server`` from tests/unit/conftest.py)."""
    asyncio.run(_stray_fields(server, garbage, klass))


async def _stray_fields(server: RedisServer, garbage: dict[str, str], klass: str) -> None:
    prefix = f"pp-win-{uuid.uuid4().hex[:8]}:"
    s = RedisStore(server.url, prefix=prefix)
    raw = aioredis.from_url(server.url)
    rule = rule_for(HOSTS[1], 1.0, 5)
    try:
        await raw.hset(s.window_key(rule), mapping=garbage)  # type: ignore[arg-type]
        c = await grant(s, HOSTS[1], klass, rule)
        # Bounded as in policy.window.live: at most AHEAD buckets ahead, then one window.
        assert math.isfinite(c.wait) and 0 <= c.wait <= (AHEAD + 2) * rule.width + rule.reach, c
        assert 0 <= await s.window_used(rule) <= 10_000_000
    finally:
        await raw.aclose()
        await s.close()


async def test_one_bucket_spelled_twice_keeps_both_counts(server: RedisServer) -> None:
    """'<i>' and '<i>.0' are one bucket to Lua's tonumber. Counted, then written back as one field each,
    the second HSET of the same name would overwrite the first: the window would forget counts."""
    prefix = f"pp-win-{uuid.uuid4().hex[:8]}:"
    s = RedisStore(server_url := server.url, prefix=prefix)
    raw = aioredis.from_url(server_url)
    rule = rule_for(HOSTS[0], 10.0, 7)
    try:
        now_us = int(time.time() * 1_000_000)
        w = 10_000_000 // 50
        i = now_us // w
        await raw.hset(s.window_key(rule), mapping={"w": str(w), str(i): "3", f"{i}.0": "3"})
        granted = 0
        for _ in range(6):
            if (await s.claim(HOSTS[0], 0.0, 0.0, 0.0, window=rule)).granted:
                granted += 1
        assert granted <= 1, f"{granted} granted with 6 of 7 already counted"
    finally:
        await raw.aclose()
        await s.close()


# -- a stray record is written back bounded, even by a refused claim ------------------------------------


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_a_far_stray_bucket_holds_one_reach_at_most(kind: str, tmp_path: Path) -> None:
    """A bucket a million buckets ahead with a full count. Bounded but not written back when the claim it
    refuses reserves nothing, it was bounded anew against each later now, a bucket further each time: the
    service stayed held for good."""
    clock = Clock()
    rule = rule_for(HOSTS[0], 2.0, 5)
    stray = WindowState(rule.width, ((round(T0 / rule.width) + 10**6, 10**6),))
    s: Store
    if kind == "memory":
        s = MemoryStore(clock=clock)
        s.windows[rule.service] = stray
    else:
        s = FileStore(tmp_path, clock=clock)
        (tmp_path / "windows" / rule.service).write_bytes(window_records.encode(stray))
    try:
        assert (await s.claim(HOSTS[0], 0.0, 0.0, 60.0, window=rule)).window
        free = T0 + (AHEAD + 1) * rule.width + rule.reach + 2 * EPSILON
        while clock.t < free:  # asked again and again meanwhile, as waiting clients do
            clock.t = min(free, clock.t + 0.25)
            c = await s.claim(HOSTS[0], 0.0, 0.0, 60.0, window=rule)
        assert c.granted, c
    finally:
        await s.close()


async def test_a_stray_redis_window_is_written_back_bounded(server: RedisServer) -> None:
    prefix = f"pp-win-{uuid.uuid4().hex[:8]}:"
    s = RedisStore(server.url, prefix=prefix)
    raw = aioredis.from_url(server.url, decode_responses=True)
    rule = rule_for(HOSTS[0], 10.0, 5)
    w = 10_000_000 // 50
    try:
        far = int(time.time() * 1_000_000) // w + 10**6
        await raw.hset(s.window_key(rule), mapping={"w": str(w), str(far): "1000000"})  # no TTL
        c = await s.claim(HOSTS[0], 0.0, 0.0, 60.0, window=rule)
        assert c.window and not c.granted
        now = int(time.time() * 1_000_000) // w
        kept = {k: v for k, v in (await raw.hgetall(s.window_key(rule))).items() if k != "w"}
        assert kept and all(int(i) <= now + AHEAD + 1 for i in kept), kept
        assert sum(int(v) for v in kept.values()) == 1_000_000  # bounded in time, not forgotten
        assert 0 < await raw.pttl(s.window_key(rule)) <= (rule.reach + AHEAD * rule.width) * 1000 + 2000
    finally:
        await raw.aclose()
        await s.close()


# -- the failover store --------------------------------------------------------------------------------


class _Down(MemoryStore):
    """A shared store that cannot answer (Redis down)."""

    async def claim(self, *a: object, **k: object) -> Claim:
        raise StoreError("down")

    async def exempt_claim(self, *a: object, **k: object) -> Claim:
        raise StoreError("down")


async def test_degraded_proxies_divide_the_window() -> None:
    """Three proxies on their fallbacks while the shared store is down: each keeps a third of the limit,
    every class together, so together they keep the limit."""
    clock = Clock()
    fo = FailoverStore(_Down(clock=clock), MemoryStore(clock=clock), gap_multiplier=3, probe_interval=60.0)
    rule = rule_for(HOSTS[1], 60.0, 10)
    fo.mirror.snaps[rule.service] = (fo.monotonic(), ())  # the shared window, read empty before the outage
    try:
        got = []
        for k in range(12):
            clock.t += 0.5
            if k % 2:
                c = await fo.claim(HOSTS[1], 0.0, 0.0, 5.0, window=rule)
            else:
                c = await fo.exempt_claim(HOSTS[2 + k % 2], RATE, BURST, 5.0, True, HOSTS[1], rule)
            got.append(c.granted)
        assert fo.degraded
        assert sum(got) == 10 // 3, got
        assert await fo.window_used(rule) == 3
    finally:
        await fo.close()
