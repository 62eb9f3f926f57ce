"""One table of (state, event) -> expected state, run against the Python rules (MemoryStore and FileStore
over ``StateMachine``: ``slots.claim``, ``slots.exempt_claim``, the sanity bounds, ``backoff.answer_delay``)
AND the Redis Lua scripts, so they cannot drift. Times in the table are seconds relative to the store's
now. Below the table, the scripts against what no row can express: a cancellation between round trips,
stray values from HSET, a record corrupted between two claims of a running proxy."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from politeproxy.policy.backoff import BackoffPolicy, Kind
from politeproxy.policy.slots import HostState, Outcome
from politeproxy.stores.base import Store
from politeproxy.stores.file import GLOBAL, FileStore, encode_host, host_file_name
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, running_redis, server_kinds

H = HOST = "data.commoncrawl.org"
NOW = 1_700_000_000.0
DAY = 86400.0
FF = 2**64 / 1e9 - NOW  # a uint64 of 0xFF bytes as UnixNano, relative to NOW (about 1.7e10 s ahead)
POLICY = BackoffPolicy(
    base=1.0, factor=2.0, cap=300.0, jitter=0.2, block_hold=10.0, block_hold_cap=40.0, adaptive_recovery=60.0
)
TIMES = (
    "next",
    "next_allowed",
    "backoff_until",
    "robots_expires",
    "probe_until",
    "adapt_from",
    "adapt_until",
)
TIMES += ("tat",)
COUNTS = ("throttles", "blocks", "fails")
DURATIONS = ("crawl_delay", "adapt_interval")
ABSENT = None  # an expected time that is not set (0 in the record)
B, F = Kind.BLOCK, Kind.FAILURE


@dataclass(frozen=True)
class Case:
    name: str
    state: dict[
        str, float
    ]  # next (global), next_allowed, backoff_until, robots_expires (relative), throttles, crawl_delay
    # ("claim", gap, interval, max_wait[, not_before]) | ("throttle", retry_after, rand[, kind, base])
    # | ("success",) | ("exempt", rate, burst, max_wait[, hold])
    event: tuple[Any, ...]
    expect: dict[str, Any] = field(default_factory=dict)  # outcome, wait, delay, and any state key after


CASES = [
    # -- claims: the slot arithmetic
    Case(
        "fresh",
        {},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next": 1.0, "probe": False},
    ),
    Case(
        "queued",
        {"next": 0.5},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.5, "next": 1.5},
    ),
    Case(
        "host_interval",
        {"next_allowed": 2.0, "next": 0.2},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 2.0, "next": 0.2},
    ),
    Case(
        "too_late_slot",
        {"next": 5.0},
        ("claim", 1.0, 0.0, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 5.0, "next": 5.0},
    ),
    Case(
        "too_late_backoff",
        {"backoff_until": 3.0},
        ("claim", 1.0, 0.0, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.0},
    ),
    Case(
        "legit_backoff_waits",
        {"backoff_until": 1000.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 1000.0, "backoff_until": 1000.0},
    ),
    Case(
        "interval_step",
        {},
        ("claim", 0.5, 2.0, None),
        {"outcome": Outcome.GRANTED, "next": 0.5, "next_allowed": 2.0},
    ),
    Case(
        "crawl_delay_step",
        {"crawl_delay": 3.0},
        ("claim", 0.5, 1.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": 3.0},
    ),
    Case(
        "gap_off",
        {"next": 0.3},
        ("claim", 0.0, 1.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next": 0.3, "next_allowed": 1.0},
    ),
    Case(
        "within_bound", {"next": 63.0}, ("claim", 1.0, 0.0, None), {"outcome": Outcome.GRANTED, "wait": 63.0}
    ),
    Case(
        "not_before",
        {"next": 0.2},
        ("claim", 1.0, 0.0, None, 0.5),
        {"outcome": Outcome.GRANTED, "wait": 0.5, "next": 1.5},
    ),
    Case(
        "not_before_too_late",
        {},
        ("claim", 1.0, 0.0, 1.0, 3.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.0},
    ),
    # -- records no legitimate wait gives (a clock step back, 0xFF bytes, a stray HSET): the global next is
    # treated as now + one gap (a record corrupted under a running proxy must not land a grant on the one it
    # just made), a host time as now
    Case(
        "global_2h_ahead",
        {"next": 7200.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 1.0, "next": 2.0},
    ),
    Case(
        "global_70s_ahead",
        {"next": 70.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 1.0, "next": 2.0},
    ),
    Case(
        "global_ahead_not_granted",
        {"next": 7200.0, "backoff_until": 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 5.0, "next": 1.0},
    ),
    Case(
        "global_ff",
        {"next": FF},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 1.0, "next": 2.0},
    ),
    Case(
        "global_before_epoch",
        {"next": -NOW - 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0},
    ),
    Case(
        "host_next_ff",
        {"next_allowed": FF},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next_allowed": 0.0},
    ),
    Case(
        "host_next_2h",
        {"next_allowed": 7200.0},
        ("claim", 1.0, 2.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next_allowed": 2.0},
    ),
    Case(
        "backoff_beyond_max",
        {"backoff_until": DAY + 100.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "backoff_until": 0.0},
    ),
    Case(
        "crawl_delay_corrupt",
        {"crawl_delay": 1e9},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "crawl_delay": 0.0},
    ),
    Case(
        "robots_far_ahead",
        {"robots_expires": 1e9},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "robots_expires": 0.0},
    ),
    # -- odd numbers handed to the store never raise (OverflowError) and never switch pacing off
    Case(
        "gap_inf", {}, ("claim", math.inf, 0.0, None), {"outcome": Outcome.GRANTED, "wait": 0.0, "next": DAY}
    ),
    Case("gap_nan", {}, ("claim", math.nan, 0.0, None), {"outcome": Outcome.GRANTED, "next": DAY}),
    Case(
        "interval_inf", {}, ("claim", 1.0, math.inf, None), {"outcome": Outcome.GRANTED, "next_allowed": DAY}
    ),
    # -- throttles: backoff.throttle_delay and apply_throttle in one step
    Case("throttle_first", {}, ("throttle", None, 0.5), {"delay": 1.1, "throttles": 1, "backoff_until": 1.1}),
    Case("throttle_fourth", {"throttles": 3}, ("throttle", None, 0.5), {"delay": 8.8, "throttles": 4}),
    Case(
        "throttle_retry_after",
        {"throttles": 2},
        ("throttle", 5.0, 0.9),
        {"delay": 5.0, "throttles": 3, "backoff_until": 5.0},
    ),
    Case("throttle_capped", {}, ("throttle", 1000.0, 0.0), {"delay": 300.0, "backoff_until": 300.0}),
    Case(
        "throttle_keeps_longer",
        {"backoff_until": 50.0},
        ("throttle", 5.0, 0.0),
        {"delay": 5.0, "backoff_until": 50.0},
    ),
    Case(
        "throttle_absurd_backoff",
        {"backoff_until": 1e5},
        ("throttle", None, 0.0),
        {"delay": 1.0, "backoff_until": 1.0},
    ),
    Case("throttle_many", {"throttles": 70}, ("throttle", None, 0.0), {"delay": 300.0, "throttles": 71}),
    Case(
        "throttle_count_corrupt",
        {"throttles": 5000},
        ("throttle", None, 0.0),
        {"delay": 300.0, "throttles": 1001},
    ),
    Case(
        "throttle_retry_after_zero",
        {},
        ("throttle", 0.0, 0.0),
        {"delay": 0.0, "backoff_until": 0.0, "throttles": 1},
    ),
    Case("throttle_retry_after_inf", {}, ("throttle", math.inf, 0.0), {"delay": 300.0}),
    Case("throttle_keeps_interval", {"next_allowed": 30.0}, ("throttle", 1.0, 0.0), {"next_allowed": 30.0}),
    # -- success resets the count, not the backoff already promised
    Case(
        "success",
        {"throttles": 3, "backoff_until": 10.0},
        ("success",),
        {"throttles": 0, "backoff_until": 10.0},
    ),
    Case("success_unknown", {}, ("success",), {"throttles": 0}),
    # -- blocks (403): block_hold doubling to block_hold_cap, Retry-After wins where longer; the interval
    # is raised (adaptive) and steps back from the end of the hold
    Case(
        "block_first",
        {},
        ("throttle", None, 0.0, B),
        {"delay": 10.0, "blocks": 1, "throttles": 1, "backoff_until": 10.0, "adapt_interval": 1.0}
        | {"adapt_from": 10.0, "adapt_until": 70.0, "probe_until": ABSENT},
    ),
    Case("block_doubles", {"blocks": 1}, ("throttle", None, 0.0, B), {"delay": 20.0, "blocks": 2}),
    Case("block_capped", {"blocks": 5}, ("throttle", None, 0.0, B), {"delay": 40.0, "blocks": 6}),
    Case("block_retry_after_longer", {}, ("throttle", 30.0, 0.0, B), {"delay": 30.0, "backoff_until": 30.0}),
    Case("block_retry_after_shorter", {}, ("throttle", 5.0, 0.0, B), {"delay": 10.0}),
    Case("block_retry_after_huge", {}, ("throttle", 1e5, 0.0, B), {"delay": 300.0, "blocks": 1}),
    Case(
        "block_on_the_probe",
        {"blocks": 1, "probe_until": 20.0},
        ("throttle", None, 0.0, B),
        {"delay": 20.0, "blocks": 2, "probe_until": ABSENT},
    ),
    Case(
        "block_hold_beyond_backoff_cap_is_sane",
        {"blocks": 3, "backoff_until": 1500.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 1500.0, "backoff_until": 1500.0},
    ),
    # -- connection failures: a throttle; FAIL_BLOCK in a row a block; any other answer ends the row
    Case("failure_first", {}, ("throttle", None, 0.0, F), {"delay": 1.0, "fails": 1, "blocks": 0}),
    Case(
        "failure_third_is_block",
        {"fails": 2, "throttles": 2},
        ("throttle", None, 0.0, F),
        {"delay": 10.0, "fails": 0, "blocks": 1, "throttles": 3},
    ),
    Case("throttle_ends_failures", {"fails": 2}, ("throttle", None, 0.0), {"fails": 0, "blocks": 0}),
    # -- the probe: when the hold ends one request goes alone; the others look again until it answers
    Case(
        "probe_granted",
        {"blocks": 1},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "probe_until": 30.0, "next": 1.0, "probe": True},
    ),
    Case(
        "probe_out_waits",
        {"blocks": 1, "probe_until": 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 0.25, "next": ABSENT, "probe": False},
    ),
    Case(
        "probe_lease_expired",
        {"blocks": 1, "probe_until": -1.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "probe_until": 30.0},
    ),
    Case(
        "hold_before_probe",
        {"blocks": 1, "backoff_until": 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 5.0, "probe_until": ABSENT},
    ),
    Case(
        "probe_until_corrupt",
        {"blocks": 1, "probe_until": 1e6},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "probe_until": 30.0},
    ),
    Case(
        "blocks_corrupt", {"blocks": 5000}, ("claim", 1.0, 0.0, None), {"blocks": 1000, "probe_until": 30.0}
    ),
    Case(
        "success_ends_block_after_hold",
        {"blocks": 2, "probe_until": 20.0, "fails": 1},
        ("success",),
        {"blocks": 0, "probe_until": ABSENT, "fails": 0},
    ),
    Case(
        "success_during_hold_keeps_block",
        {"blocks": 1, "backoff_until": 50.0, "throttles": 1},
        ("success",),
        {"blocks": 1, "throttles": 0, "backoff_until": 50.0},
    ),
    # -- the adaptive interval: at least doubles on a throttle (floor 1 s), steps back in 4 equal steps
    Case(
        "adaptive_raised_first",
        {},
        ("throttle", 2.0, 0.0, Kind.THROTTLE, 0.5),
        {"adapt_interval": 1.0, "adapt_from": 2.0, "adapt_until": 62.0},
    ),
    Case(
        "adaptive_doubles_current",
        {"adapt_interval": 3.0, "adapt_from": -1.0, "adapt_until": 59.0},
        ("throttle", 2.0, 0.0, Kind.THROTTLE, 0.5),
        {"adapt_interval": 6.0, "adapt_from": 2.0, "adapt_until": 62.0},
    ),
    Case(
        "adaptive_doubles_from_a_step",
        {"adapt_interval": 4.5, "adapt_from": -31.0, "adapt_until": 29.0},
        ("throttle", None, 0.0, Kind.THROTTLE, 0.5),
        {"adapt_interval": 5.0, "delay": 1.0},
    ),
    Case(
        "adaptive_claim_raised",
        {"adapt_interval": 4.0, "adapt_from": 10.0, "adapt_until": 70.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": 4.0},
    ),
    Case(
        "adaptive_claim_second_step",
        {"adapt_interval": 4.5, "adapt_from": -31.0, "adapt_until": 29.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": 2.5},
    ),
    Case(
        "adaptive_claim_recovered",
        {"adapt_interval": 4.0, "adapt_from": -61.0, "adapt_until": -1.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": ABSENT},
    ),
    Case(
        "adaptive_interval_corrupt",
        {"adapt_interval": 1e9, "adapt_from": 0.0, "adapt_until": 60.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "adapt_interval": 0.0, "next_allowed": ABSENT},
    ),
    Case(
        "adaptive_from_the_future",
        {"adapt_interval": 2.0, "adapt_from": 1e7, "adapt_until": 1e7 + 60},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "adapt_from": 0.0, "adapt_until": 0.0, "next_allowed": ABSENT},
    ),
    # -- the exempt ceiling (GCRA): a burst at once, then one per rate; held by backoff, block and probe
    Case(
        "exempt_fresh",
        {},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "tat": 0.02},
    ),
    Case(
        "exempt_within_burst",
        {"tat": 1.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "tat": 1.02},
    ),
    Case(
        "exempt_burst_spent",
        {"tat": 2.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.02, "tat": 2.02},
    ),
    Case(
        "exempt_too_late",
        {"tat": 5.0},
        ("exempt", 0.02, 100, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.02, "tat": 5.0},
    ),
    Case(
        "exempt_backoff",
        {"backoff_until": 3.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 3.0, "tat": ABSENT},
    ),
    Case(
        "exempt_backoff_too_late",
        {"backoff_until": 3.0},
        ("exempt", 0.02, 100, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.0},
    ),
    Case(
        "exempt_probe_out",
        {"blocks": 1, "probe_until": 5.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 0.25},
    ),
    Case(
        "exempt_is_the_probe",
        {"blocks": 1},
        ("exempt", 0.0, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "probe_until": 30.0, "probe": True},
    ),
    Case(
        "exempt_ceiling_off",
        {"tat": 50.0},
        ("exempt", 0.0, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0},
    ),
    Case(
        "exempt_tat_corrupt",
        {"tat": 1e6},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "tat": 0.02},
    ),
    Case(
        "exempt_not_holding_the_backoff",
        {"backoff_until": 3.0, "blocks": 1, "tat": 2.0},
        ("exempt", 0.02, 100, None, False),
        {"outcome": Outcome.GRANTED, "wait": 0.02, "tat": 2.02, "probe_until": ABSENT, "blocks": 1},
    ),
    Case(
        "exempt_burst_one",
        {"tat": 0.5},
        ("exempt", 1.0, 1, None),
        {"outcome": Outcome.GRANTED, "wait": 0.5, "tat": 1.5},
    ),
]

KINDS = server_kinds()
IDS = [c.name for c in CASES]


def host_state(state: dict[str, float], now: float) -> HostState:
    times = {k: now + state[k] for k in TIMES[1:] if k in state}
    counts = {k: int(state[k]) for k in COUNTS if k in state}
    return HostState(**times, **counts, **{k: state[k] for k in DURATIONS if k in state})


def observed(st: HostState, global_next: float, now: float) -> dict[str, Any]:
    """A store's record as the table speaks of it: times relative to now, ABSENT when not set."""
    got: dict[str, Any] = {"next": global_next - now if global_next else ABSENT}
    for key in TIMES[1:]:
        t = getattr(st, key)
        got[key] = t - now if t else ABSENT
    got |= {k: getattr(st, k) for k in COUNTS + DURATIONS}
    return got


async def run_event(store: Store, event: tuple[Any, ...]) -> dict[str, Any]:
    """Apply the event; return what the store answered (outcome and wait, or the delay)."""
    if event[0] == "claim":
        c = await store.claim(H, event[1], event[2], event[3], *event[4:])
        assert math.isfinite(c.wait)
        return {"outcome": c.outcome, "wait": c.wait, "probe": c.probe}
    if event[0] == "throttle":
        d = await store.throttled(H, event[1], POLICY, *event[3:])
        assert math.isfinite(d.seconds)
        return {"delay": d.seconds}
    if event[0] == "exempt":
        c = await store.exempt_claim(H, event[1], event[2], event[3], *event[4:])
        assert math.isfinite(c.wait)
        return {"outcome": c.outcome, "wait": c.wait, "probe": c.probe}
    await store.succeeded(H)
    return {}


def check(case: Case, got: dict[str, Any], tolerance: float) -> None:
    for key, want in case.expect.items():
        assert key in got, f"{case.name}: {key} missing"
        if isinstance(want, Outcome | bool) or want is ABSENT or got[key] is ABSENT:
            assert got[key] is want, f"{case.name}: {key} {got[key]} != {want}"
        else:
            assert got[key] == pytest.approx(want, abs=tolerance), f"{case.name}: {key} {got[key]} != {want}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_python_rules(case: Case) -> None:
    """The Python StateMachine (the memory and file stores' logic) gives the table's answers."""
    r = case.event[2] if case.event[0] == "throttle" else 0.0
    store = MemoryStore(lambda: NOW, rand=lambda: r)
    store.global_next = NOW + case.state.get("next", -NOW)
    if set(case.state) - {"next"}:
        store.hosts[H] = host_state(case.state, NOW)
    got = await run_event(store, case.event)
    check(case, got | observed(store.hosts.get(H, HostState()), store.global_next, NOW), 1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_file_store(case: Case, tmp_path: Path) -> None:
    """The file store (records on disk, read back under the flock) gives the table's answers."""
    r = case.event[2] if case.event[0] == "throttle" else 0.0
    store = FileStore(tmp_path, lambda: NOW, rand=lambda: r)
    try:
        if "next" in case.state:
            gnext = round((NOW + case.state["next"]) * 1e9)
            (tmp_path / "ratelimit.lock").write_bytes(GLOBAL.pack(min(max(gnext, 0), 2**64 - 1), 0))
        if set(case.state) - {"next"}:
            (tmp_path / "hosts" / host_file_name(H)).write_bytes(encode_host(host_state(case.state, NOW)))
        got = await run_event(store, case.event)
        nxt, _count = store._read_global()
        check(case, got | observed(store._read_host(H), nxt, NOW), 1e-6)
    finally:
        await store.close()


@pytest.fixture(scope="module", params=sorted(KINDS) or ["redis"])
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    with running_redis(KINDS.get(request.param)) as s:
        yield s


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_redis_scripts(case: Case, server: RedisServer, raw: aioredis.Redis) -> None:
    """The Lua scripts give the same answers (times within the few ms between our TIME and the script's)."""
    r = case.event[2] if case.event[0] == "throttle" else 0.0
    store = RedisStore(server.url, prefix=f"pp-cases-{uuid.uuid4().hex[:8]}:", rand=lambda: r)
    try:
        sec, usec = await raw.time()
        now_us = sec * 1_000_000 + usec
        rel = {k: f"{now_us + v * 1e6:.0f}" for k, v in case.state.items() if k in TIMES}
        if "next" in rel:
            await raw.hset(store.global_key, mapping={"next": rel.pop("next"), "count": 0})
        fields = {**rel, **{k: f"{v * 1e6:.0f}" for k, v in case.state.items() if k in DURATIONS}}
        fields |= {k: str(int(case.state[k])) for k in COUNTS if k in case.state}
        if fields:
            await raw.hset(store.host_key(H), mapping=fields)
        got = await run_event(store, case.event)
        g = await raw.hgetall(store.global_key)
        h = await raw.hgetall(store.host_key(H))
        for key in TIMES:
            t = float((g if key == "next" else h).get(key, 0))
            got[key] = (t - now_us) / 1e6 if t else ABSENT
        got |= {k: int(float(h.get(k, 0))) for k in COUNTS}
        got |= {k: float(h.get(k, 0)) / 1e6 for k in DURATIONS}
        check(case, got, 0.05)
    finally:
        await store.close()


# -- the same scripts against records and cancellations no table row can express ------------------------


@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[RedisStore]:
    s = RedisStore(server.url, prefix=f"pp-cases-{uuid.uuid4().hex[:8]}:", rand=lambda: 0.0)
    yield s
    await s.close()


async def test_a_global_record_corrupted_mid_run_never_repeats_a_slot(
    store: RedisStore, raw: aioredis.Redis
) -> None:
    """A stray HSET of the global next mid-run: the next grant follows the ones this proxy made."""
    await store.claim(HOST, 0.1, 0.0, None)
    await store.claim(HOST, 0.1, 0.0, None)  # its slot is ~0.1 s ahead, next ~0.2 s
    await raw.hset(store.global_key, "next", "1e30")
    c = await store.claim(HOST, 0.1, 0.0, None)
    assert c.granted and c.wait >= 0.2 - 0.02


async def test_a_throttle_cannot_be_cut_in_half(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client leaves right after the first round trip of throttled() (item 5). With two scripts the
    throttle was counted but its backoff never applied; with one, the count and the backoff go together."""
    real = store._script

    async def cancelled_after_first(*args: Any) -> Any:
        await real(*args)
        raise asyncio.CancelledError  # the handler is cancelled as the answer arrives

    monkeypatch.setattr(store, "_script", cancelled_after_first)
    with pytest.raises(asyncio.CancelledError):
        await store.throttled(HOST, 5.0, BackoffPolicy(cap=300.0))
    monkeypatch.setattr(store, "_script", real)
    view = await store.host_view(HOST)
    assert view.throttles == 1 and 4.5 < view.backoff_in <= 5.0


@pytest.mark.parametrize(
    "fields",
    [
        {"backoff_until": "1e400", "next_allowed": "nan", "throttles": "abc", "crawl_delay": "-inf"},
        {"backoff_until": "BIG", "next_allowed": "BIG", "robots_expires": "BIG", "crawl_delay": "1e15"},
    ],
)
async def test_stray_host_fields_are_treated_as_now(
    store: RedisStore, raw: aioredis.Redis, fields: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A host hash written by anyone (two HSETs through an open proxy, item 11/12): values that are not
    numbers, or a backoff a billion seconds ahead, are treated as now, logged once, and never raise (a
    stray value used to break PEXPIRE too); the record is rewritten sane."""
    seconds, _ = await raw.time()
    big = f"{(seconds + 1_000_000_000) * 1_000_000:.0f}"
    await raw.hset(store.host_key(HOST), mapping={k: big if v == "BIG" else v for k, v in fields.items()})
    for _ in range(3):
        c = await store.claim(HOST, 0.01, 0.0, 1.0)
        assert c.granted and c.wait <= 0.011
        view = await store.host_view(HOST)
        assert view.backoff_in == 0.0 and view.crawl_delay == 0.0 and not view.robots_fresh
        await asyncio.sleep(0.011)
    assert (await store.throttled(HOST, None, BackoffPolicy(cap=30.0, jitter=0.0))).seconds == 1.0
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert float((await raw.hget(store.host_key(HOST), "backoff_until")) or 0) < (seconds + 60) * 1_000_000
