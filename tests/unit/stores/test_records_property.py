"""Property tests for the store records (untrusted input: ccrawl, a crash, a disk, a stray HSET).

Each property states what it checks; none may raise or yield a non-finite time, and every time a store
derives from a record lies within the sanity bound of ``policy/slots.py``. Below the properties, the same
records in a real file store: corrupt files, records from the future, raw host names, odd numbers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import struct
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from politeproxy.policy.backoff import BackoffPolicy, Kind
from politeproxy.policy.slots import (
    MAX_BACKOFF,
    MAX_CRAWL_DELAY,
    MAX_DURATION,
    MAX_RECOVERY,
    MAX_ROBOTS_TTL,
    MAX_TAT,
    MAX_THROTTLES,
    PROBE_LEASE,
    Bounds,
    HostState,
    Outcome,
    adaptive_interval,
    sane_global,
    sane_host,
)
from politeproxy.stores.base import Store
from politeproxy.stores.file import FileStore
from politeproxy.stores.file_records import GLOBAL, HOST_V1, decode_global, decode_host, host_file_name
from politeproxy.stores.memory import MemoryStore

NOW = 1_700_000_000.0
H = "data.commoncrawl.org"
NOJITTER = BackoffPolicy(base=1.0, cap=300.0, jitter=0.0)
any_float = st.floats(allow_nan=True, allow_infinity=True)
gaps = st.floats(min_value=0.0, max_value=3600.0)
# any length, and the two record sizes, with all-0xFF (ccrawl's count or a throttle count at its maximum)
record_bytes = st.one_of(
    st.just(b"\xff" * 16),
    st.just(b"\xff" * 40),
    st.binary(min_size=0, max_size=60),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=40, max_size=40),
    st.just(b"\xff" * 96),
    st.binary(min_size=96, max_size=96),
)


@given(record_bytes)
def test_decode_never_raises_and_is_finite(data: bytes) -> None:
    """Any bytes (16, 40, short, long) decode without raising; a short record is None, else finite values."""
    g = decode_global(data)
    assert (g is None) == (len(data) < GLOBAL.size)
    if g is not None:
        assert math.isfinite(g[0]) and g[0] >= 0 and 0 <= g[1] < 2**64
    h = decode_host(data)
    assert (h is None) == (len(data) < HOST_V1.size)  # a 40-byte record of earlier versions still reads
    if h is not None:
        for t in (h.next_allowed, h.backoff_until, h.robots_expires, h.crawl_delay, h.probe_until, h.tat):
            assert math.isfinite(t) and t >= 0
        for t in (h.adapt_interval, h.adapt_from, h.adapt_until):
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


@given(any_float, any_float, any_float, any_float, any_float, st.integers(-(2**70), 2**70), gaps, gaps)
def test_sane_host_bounds_the_block_probe_adaptive_and_exempt_fields(
    probe: float, ai: float, afrom: float, auntil: float, tat: float, blocks: int, gap: float, base: float
) -> None:
    """The fields added for blocks, probes, the adaptive interval and the exempt ceiling come out finite and
    within their bounds whatever the record held (records from the future are treated as now), and the
    effective interval derived from them is finite, at least the configured one and at most the raised one
    or the ceiling of any interval."""
    b = Bounds(gap=gap, step=base, backoff=300.0)
    rec = HostState(blocks=blocks, probe_until=probe, adapt_interval=ai, adapt_from=afrom, adapt_until=auntil)
    h, _ = sane_host(replace(rec, tat=tat), NOW, b)
    assert 0 <= h.blocks <= MAX_THROTTLES
    assert 0 <= h.probe_until <= NOW + b.schedule() + PROBE_LEASE
    assert 0 <= h.adapt_interval <= MAX_DURATION
    assert (
        0 <= h.adapt_from <= NOW + MAX_BACKOFF + 1
        and 0 <= h.adapt_until <= NOW + MAX_BACKOFF + 1 + MAX_RECOVERY
    )
    assert 0 <= h.tat <= NOW + MAX_TAT
    eff = adaptive_interval(h, NOW, base)
    assert math.isfinite(eff) and base <= eff <= max(base, h.adapt_interval)


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
    st.sampled_from(["claim", "throttle", "block", "exempt", "view", "crawl"]),
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
                b.schedule(), b.host_next(MAX_CRAWL_DELAY, MAX_DURATION), MAX_BACKOFF + 1
            )
        elif op == "block":
            d_ = await store.throttled(H, None, BackoffPolicy(cap=300.0), Kind.BLOCK, interval)
            assert math.isfinite(d_.seconds) and 0 <= d_.seconds <= 1800.0
        elif op == "exempt":
            c = await store.exempt_claim(H, 0.02, 100, None)
            assert math.isfinite(c.wait) and 0 <= c.wait <= MAX_BACKOFF + 1
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
        for v in (
            view.probe_in,
            view.adapt_interval,
            view.adapt_from_in,
            view.adapt_until_in,
            view.interval(1),
        ):
            assert math.isfinite(v)
        g = decode_global((d / "ratelimit.lock").read_bytes())
        if g is not None and op == "claim":
            assert g[0] <= NOW + b.schedule() + gap
    finally:
        await store.close()


# -- corrupt records in a real file store (items 3 and 12) --------------------------------------------------

T0 = NOW
NS = 1_000_000_000


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def read_lock(data_dir: Path) -> tuple[int, int]:
    data = (data_dir / "ratelimit.lock").read_bytes()
    assert len(data) == 16
    return struct.unpack(">QQ", data)


async def test_corrupt_lock_file_is_treated_as_now_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """16 bytes of 0xFF (item 3): the claim does not raise (struct.error on count + 1 before), the slot is
    now, the record is written back sane, and one warning says so however many claims read it."""
    caplog.set_level(logging.DEBUG, logger="politeproxy.store")
    clock = Clock()
    s = FileStore(tmp_path, clock)
    for _ in range(3):
        clock.t += 1.0
        (tmp_path / "ratelimit.lock").write_bytes(b"\xff" * 16)
        (tmp_path / "hosts" / H).write_bytes(b"\xff" * 40)
        c = await s.claim(H, 0.2, 0.0, None)
        assert c.granted and c.wait == pytest.approx(0.2)  # now + one gap
        nxt, _count = read_lock(tmp_path)
        assert nxt == pytest.approx(int((clock.t + 0.4) * NS), abs=1000)
        view = await s.host_view(H)
        assert view.backoff_in == 0.0 and view.ready_in == 0.0 and view.crawl_delay == 0.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one for the global record, one for host records
    await s.close()


async def test_a_record_corrupted_under_a_running_store_never_repeats_a_slot(tmp_path: Path) -> None:
    """The fault suite rewrote ratelimit.lock with 0xFF mid-run: "treated as now" forgot the slots this
    store had just handed out and granted one on top of them. Now an insane record counts as now + one
    gap, or the next this store wrote last when that is later."""
    clock = Clock()
    s = FileStore(tmp_path, clock)
    assert (await s.claim(H, 0.2, 0.0, None)).wait == 0.0
    assert (await s.claim(H, 0.2, 0.0, None)).wait == pytest.approx(0.2)  # pending, like a second proxy's
    (tmp_path / "ratelimit.lock").write_bytes(b"\xff" * 16)
    assert (await s.claim(H, 0.2, 0.0, None)).wait == pytest.approx(0.4)
    await s.close()


async def test_host_record_from_the_future_is_treated_as_now(tmp_path: Path) -> None:
    """A host record 2 h ahead (a clock step back, item 12) holds a 1 s-interval host for 1 s, not 2 h;
    a backoff further ahead than the cap is dropped, one within it is kept."""
    clock = Clock()
    s = FileStore(tmp_path, clock, max_backoff=300.0)
    far = struct.pack(">QQQQQ", int((T0 + 7200) * NS), int((T0 + 7200) * NS), 0, 0, 0)
    (tmp_path / "hosts" / H).write_bytes(far)
    c = await s.claim(H, 0.1, 1.0, None)
    assert c.granted and c.wait == 0.0
    assert 0.9 < (await s.host_view(H)).ready_in <= 1.0
    await s.throttled(H, 200.0, BackoffPolicy(cap=300.0))
    assert (await s.claim(H, 0.1, 1.0, None)).wait == pytest.approx(200.0)
    await s.close()


async def test_raw_host_names_never_become_paths(tmp_path: Path) -> None:
    """A name that is not RFC 1123 labels is stored under a hashed name inside hosts/, never joined into a
    path (item 9): nothing is written outside the data dir, and the name is still paced."""
    d = tmp_path / "data"
    s = FileStore(d)
    for bad in ("../../escape.commoncrawl.org", "/tmp/abs.commoncrawl.org", "a\x00b.org", "..", "x/../../y"):
        assert (await s.claim(bad, 0.0, 5.0, None)).granted
        assert (await s.claim(bad, 0.0, 5.0, None)).outcome is Outcome.HOST_NOT_READY
    assert sorted(os.listdir(tmp_path)) == ["data"]
    assert all(n.startswith("_") for n in os.listdir(d / "hosts"))
    assert "abs.commoncrawl.org" not in os.listdir("/tmp")
    await s.close()


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_odd_numbers_never_raise(kind: str, tmp_path: Path) -> None:
    """An "inf", NaN or huge gap, interval, max_wait or Retry-After never makes a store raise
    (OverflowError before), and never switches pacing off: NaN and inf count as the longest gap."""
    s: Store = MemoryStore() if kind == "memory" else FileStore(tmp_path)
    for bad in (float("inf"), float("nan"), 1e400, 1e300, -1.0):
        await s.claim(H + ".x", bad, 0.0, None)
        await s.claim(H, 0.1, bad, bad)
        await s.throttled(H, bad, NOJITTER)
        await s.set_crawl_delay(H, bad, bad)
        view = await s.host_view(H)
        assert all(v == v and v != float("inf") for v in (view.ready_in, view.backoff_in, view.crawl_delay))
    assert (await s.claim("index.commoncrawl.org", float("nan"), 0.0, None)).granted
    assert not (await s.claim("commoncrawl.org", float("nan"), 0.0, 5.0)).granted  # a NaN gap is a long gap
    await s.close()


async def test_a_name_that_is_only_looked_at_leaves_no_file(tmp_path: Path) -> None:
    """A view, a success or a refused claim of a new name creates nothing in hosts/ and holds no fd: only
    a granted host's record, or one with something in it, is written (before, every name looked at cost a
    file and an fd). The granted host's record is made at its first grant, so that later claims read an
    open file instead of trying to open a missing one each time."""
    s = FileStore(tmp_path)
    await s.claim(H, 10.0, 0.0, None)  # the schedule is now 10 s ahead
    granted = os.listdir(tmp_path / "hosts")
    assert granted == [host_file_name(H)] and list(s.host_fds) == granted
    await s.host_view("a.data.commoncrawl.org")
    await s.succeeded("b.data.commoncrawl.org")
    assert not (await s.claim("c.data.commoncrawl.org", 10.0, 1.0, 1.0)).granted  # too late: refused
    assert os.listdir(tmp_path / "hosts") == granted and list(s.host_fds) == granted
    await s.close()
