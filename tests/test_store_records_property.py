"""Property tests for the store records (untrusted input: ccrawl, a crash, a disk, a stray HSET).

Each property states what it checks; none may raise or yield a non-finite time, and every time a store
derives from a record lies within the sanity bound of ``policy/slots.py``.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.slots import (
    MAX_BACKOFF,
    MAX_CRAWL_DELAY,
    MAX_ROBOTS_TTL,
    MAX_THROTTLES,
    Bounds,
    HostState,
    sane_global,
    sane_host,
)
from politeproxy.stores.file import GLOBAL, HOST, FileStore, decode_global, decode_host, host_file_name

NOW = 1_700_000_000.0
H = "data.commoncrawl.org"
any_float = st.floats(allow_nan=True, allow_infinity=True)
gaps = st.floats(min_value=0.0, max_value=3600.0)
# any length, and the two record sizes, with all-0xFF (ccrawl's count or a throttle count at its maximum)
record_bytes = st.one_of(
    st.just(b"\xff" * 16),
    st.just(b"\xff" * 40),
    st.binary(min_size=0, max_size=60),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=40, max_size=40),
)


@given(record_bytes)
def test_decode_never_raises_and_is_finite(data: bytes) -> None:
    """Any bytes (16, 40, short, long) decode without raising; a short record is None, else finite values."""
    g = decode_global(data)
    assert (g is None) == (len(data) < GLOBAL.size)
    if g is not None:
        assert math.isfinite(g[0]) and g[0] >= 0 and 0 <= g[1] < 2**64
    h = decode_host(data)
    assert (h is None) == (len(data) < HOST.size)
    if h is not None:
        for t in (h.next_allowed, h.backoff_until, h.robots_expires, h.crawl_delay):
            assert math.isfinite(t) and t >= 0


@given(any_float, gaps)
def test_sane_global_is_within_a_minute_and_a_few_gaps(t: float, gap: float) -> None:
    """Whatever the recorded next slot (NaN, inf, negative, far ahead), the one used is finite, not before
    the epoch, and at most a minute plus four gaps ahead of now."""
    b = Bounds(gap=gap)
    v, ok = sane_global(t, NOW, b)
    assert math.isfinite(v) and 0 <= v <= NOW + b.schedule()
    assert ok == (t == t and t <= NOW + b.schedule())


@given(any_float, any_float, any_float, any_float, st.integers(-(2**70), 2**70), gaps, gaps)
def test_sane_host_is_within_bounds(
    nxt: float, until: float, robots: float, delay: float, throttles: int, gap: float, step: float
) -> None:
    """Every field of a host record comes out finite and within its bound: next_allowed within the
    schedule bound plus the host's step, backoff_until within the backoff cap, robots within its TTL
    ceiling, the crawl delay within its ceiling, the count within 0..MAX_THROTTLES."""
    b = Bounds(gap=gap, step=step, backoff=300.0)
    h, _ = sane_host(HostState(nxt, until, throttles, delay, robots), NOW, b)
    assert 0 <= h.crawl_delay <= MAX_CRAWL_DELAY
    assert 0 <= h.next_allowed <= NOW + b.host_next(h.crawl_delay)
    assert 0 <= h.backoff_until <= NOW + 301.0
    assert 0 <= h.robots_expires <= NOW + MAX_ROBOTS_TTL
    assert 0 <= h.throttles <= MAX_THROTTLES


def test_host_file_names_never_reach_a_path() -> None:
    """Only RFC 1123 names become file names; anything else is a hash with no separator or dot-dot."""
    assert host_file_name("Data.CommonCrawl.org.") == "data.commoncrawl.org"
    for bad in ("../../x.commoncrawl.org", "/etc/passwd", "a/b.org", "a..b.org", "x\x00.org", "..", ""):
        name = host_file_name(bad)
        assert name.startswith("_") and "/" not in name and ".." not in name and "\x00" not in name


@given(st.text(max_size=300))
def test_any_host_name_gives_a_plain_file_name(host: str) -> None:
    """Any string maps to one plain file name: no separator, no NUL, not '.' or '..', at most 253 chars."""
    name = host_file_name(host)
    assert name and "/" not in name and "\x00" not in name and name not in (".", "..") and len(name) <= 253


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    record_bytes,
    record_bytes,
    gaps,
    st.floats(0.0, 100.0),
    st.sampled_from(["claim", "throttle", "view", "crawl"]),
)
def test_file_store_on_any_records(glob: bytes, host: bytes, gap: float, interval: float, op: str) -> None:
    """A FileStore whose ratelimit.lock and hosts/ record hold any bytes answers every operation without
    raising: a claim's wait, a throttle's delay and a view's times are finite and within the bounds, and
    the records it writes back decode to times within them too."""
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_one_file_op(Path(tmp), glob, host, gap, interval, op))


async def _one_file_op(d: Path, glob: bytes, host: bytes, gap: float, interval: float, op: str) -> None:
    store = FileStore(d, clock=lambda: NOW)
    try:
        (d / "ratelimit.lock").write_bytes(glob)
        (d / "hosts" / H).write_bytes(host)
        b = Bounds(gap=gap, step=interval, backoff=MAX_BACKOFF)
        if op == "claim":
            c = await store.claim(H, gap, interval, None)
            assert math.isfinite(c.wait) and 0 <= c.wait <= max(
                b.schedule(), b.host_next(MAX_CRAWL_DELAY), MAX_BACKOFF + 1
            )
        elif op == "throttle":
            d_ = await store.throttled(H, None, BackoffPolicy(cap=300.0))
            assert math.isfinite(d_.seconds) and 0 <= d_.seconds <= 300.0
        elif op == "crawl":
            await store.set_crawl_delay(H, 5.0, 60.0)
        view = await store.host_view(H)
        for v in (view.ready_in, view.backoff_in, view.crawl_delay):
            assert math.isfinite(v) and v >= 0
        assert view.backoff_in <= MAX_BACKOFF + 1
        assert view.crawl_delay <= MAX_CRAWL_DELAY
        g = decode_global((d / "ratelimit.lock").read_bytes())
        if g is not None and op == "claim":
            assert g[0] <= NOW + b.schedule() + gap
    finally:
        await store.close()
