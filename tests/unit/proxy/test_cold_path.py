"""Issue 15, the cold path: the shortcuts taken for speed give the same answers as the general code, the
permit is one small object per request, and the optional aiofastnet transports fall back cleanly.
Answers and structure, never speed."""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from politeproxy.pacing.pacer import Pacer, PacingSettings, Permit, WaitTooLong
from politeproxy.policy.classify import Klass
from politeproxy.policy.hosts import host_matches
from politeproxy.policy.slots import MAX_THROTTLES, Bounds, HostState, bounded_host, sane_host
from politeproxy.proxy.common import fastnet
from politeproxy.proxy.origin.upstream import HOP_BY_HOP, strip_hop_by_hop
from politeproxy.stores.memory import MemoryStore

H = "data.commoncrawl.org"
NOW = 1.7e9

TIMES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=NOW),  # the usual record: every time in the past
    st.floats(min_value=NOW - 10, max_value=NOW + 10),
    st.just(0.0),
)
COUNTS = st.one_of(st.integers(min_value=-5, max_value=MAX_THROTTLES + 5), st.just(0))
RECORDS = st.builds(
    HostState, TIMES, TIMES, COUNTS, TIMES, TIMES, COUNTS, COUNTS, TIMES, TIMES, TIMES, TIMES, TIMES
)
BOUNDS = st.builds(
    Bounds,
    st.one_of(st.floats(min_value=-10, max_value=1e6), st.just(math.nan)),
    st.floats(min_value=0, max_value=1e6),
    st.one_of(st.floats(min_value=-10, max_value=1e6), st.just(math.nan)),
)


@given(RECORDS, st.one_of(st.just(NOW), st.floats(min_value=0.0, max_value=2e9)), BOUNDS)
def test_sane_host_shortcut_gives_the_bounded_answer(h: HostState, now: float, b: Bounds) -> None:
    """Any record a store may hold (NaN, inf, negative, far-future times, counts out of range) and any
    bounds: ``sane_host`` with its within-bounds shortcut returns what the full per-field check returns,
    never raises, and (for bounds a store builds: never NaN) every time it returns is finite."""
    fast, full = sane_host(h, now, b), bounded_host(h, now, b)
    assert fast == full  # a sane record holds no NaN, so equality is exact
    if b.gap == b.gap and b.backoff == b.backoff:  # stores build bounds from clamped durations: never NaN
        for t in (fast[0].next_allowed, fast[0].backoff_until, fast[0].tat, fast[0].probe_until):
            assert math.isfinite(t)


def test_sane_host_returns_the_same_record_when_it_is_at_rest() -> None:
    h = HostState(next_allowed=NOW - 1, tat=NOW - 2)
    out, ok = sane_host(h, NOW, Bounds())
    assert ok and out is h  # no new record built for the usual case


def test_sane_host_returns_the_same_record_for_a_legitimate_wait_ahead() -> None:
    """A paced host's next slot and a backoff lie ahead of now on most claims: still no new record."""
    h = HostState(next_allowed=NOW + 2, backoff_until=NOW + 30, throttles=2, tat=NOW + 1)
    out, ok = sane_host(h, NOW, Bounds(gap=0.5, step=2.0, backoff=60.0))
    assert ok and out is h


def settings(**kw: Any) -> PacingSettings:
    return PacingSettings(gap=0.0, host_intervals=(), **kw)


async def test_permit_is_one_small_object_not_a_generator() -> None:
    """``Pacer.permit`` returns the Permit itself (no @asynccontextmanager per request); entering gives it."""
    pacer = Pacer(MemoryStore(rand=lambda: 0.0), settings())
    try:
        cm = pacer.permit(H, Klass.PACED, None, "me")
        assert type(cm) is Permit
        async with cm as p:
            assert p is cm and p.pipeline == "me" and p.waited >= 0.0
            assert await p.answered(200, None) is None
    finally:
        await pacer.close()


async def test_an_exempt_permit_gives_its_place_back_on_every_way_out() -> None:
    pacer = Pacer(MemoryStore(rand=lambda: 0.0), settings(exempt_max_in_flight=1))
    try:
        async with pacer.permit(H, Klass.EXEMPT) as p:
            assert pacer.snapshot().exempt_in_flight.get(H, 0) == 1 and p.klass is Klass.EXEMPT
        assert pacer.snapshot().exempt_in_flight.get(H, 0) == 0
        with pytest.raises(RuntimeError):
            async with pacer.permit(H, Klass.EXEMPT):
                raise RuntimeError("the exchange failed")
        assert pacer.snapshot().exempt_in_flight.get(H, 0) == 0
        # A place held elsewhere: a waiter that times out holds nothing afterwards.
        async with pacer.permit(H, Klass.EXEMPT):
            pacer.reload(settings(exempt_max_in_flight=1, max_wait=0.05))
            with pytest.raises(WaitTooLong):
                async with pacer.permit(H, Klass.EXEMPT):
                    pass
            assert pacer.snapshot().exempt_in_flight.get(H, 0) == 1
        assert pacer.snapshot().exempt_in_flight.get(H, 0) == 0
    finally:
        await pacer.close()


async def test_fastnet_off_by_environment_leaves_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLITEPROXY_FASTNET", "0")
    loop = asyncio.get_running_loop()
    before = loop.create_connection
    assert fastnet.enable(loop) is None
    assert loop.create_connection == before


async def test_fastnet_absent_falls_back_to_the_loops_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLITEPROXY_FASTNET", raising=False)
    real = importlib.import_module

    def no_fastnet(name: str, *a: Any) -> Any:
        if name == "aiofastnet":
            raise ImportError("not installed")
        return real(name, *a)

    monkeypatch.setattr(fastnet.importlib, "import_module", no_fastnet)
    loop = asyncio.get_running_loop()
    before = loop.start_tls
    assert fastnet.enable(loop) is None
    assert loop.start_tls == before


async def test_fastnet_that_cannot_patch_warns_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("POLITEPROXY_FASTNET", raising=False)

    class Broken:
        @staticmethod
        def patch_loop(loop: object) -> None:
            raise RuntimeError("unsupported loop")

    monkeypatch.setattr(fastnet.importlib, "import_module", lambda name, *a: Broken)
    with caplog.at_level(logging.WARNING, logger="politeproxy"):
        assert fastnet.enable(asyncio.get_running_loop()) is None
    assert "could not patch" in caplog.text


def test_fastnet_patches_a_loop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("aiofastnet")
    monkeypatch.delenv("POLITEPROXY_FASTNET", raising=False)
    loop = asyncio.new_event_loop()
    try:
        before = loop.create_server
        assert (fastnet.enable(loop) or "").startswith("aiofastnet ")
        assert loop.create_server != before
    finally:
        loop.close()


@given(
    st.text(max_size=40),
    st.lists(
        st.tuples(
            st.sampled_from(["index.commoncrawl.org", "*.commoncrawl.org", "x.y", "*"]), st.floats(0, 10)
        ),
        max_size=3,
    ),
)
def test_interval_for_memo_gives_the_pattern_scan_answer(host: str, table: list[tuple[str, float]]) -> None:
    """Any client-chosen host and interval table: the memoised ``interval_for`` returns the first matching
    pattern's interval, as the plain scan does, asked twice (the second answer from the cache)."""
    s = PacingSettings(host_intervals=tuple(table))
    want = next((i for p, i in table if host_matches(host, p)), 0.0)
    assert s.interval_for(host) == want
    assert s.interval_for(host) == want


NAMES = st.sampled_from(
    [
        "Connection",
        "connection",
        "Keep-Alive",
        "TE",
        "Host",
        "Expect",
        "X-A",
        "x-a",
        "Range",
        "Upgrade",
        "ETag",
    ]
)


@given(
    st.lists(st.tuples(NAMES, st.text(max_size=30)), max_size=12),
    st.sampled_from([(), ("Host", "Expect"), ("x-a",)]),
)
def test_strip_hop_by_hop_keeps_exactly_the_end_to_end_fields(
    fields: list[tuple[str, str]], drop: tuple[str, ...]
) -> None:
    """Any header list a client or an upstream sends (Connection naming any fields, in any case, repeated,
    with empty items): every other field is kept in order, with its value; hop-by-hop fields, those the
    Connection headers name and ``drop`` are gone. The plain rule is spelled out here as the reference."""
    headers = CIMultiDictProxy(CIMultiDict(fields))
    named = {n.strip().lower() for k, v in fields if k.lower() == "connection" for n in v.split(",")}
    skip = HOP_BY_HOP | named | {d.lower() for d in drop}
    assert list(strip_hop_by_hop(headers, drop).items()) == [
        (k, v) for k, v in fields if k.lower() not in skip
    ]
