"""The claim-case table's vocabulary: the store's now, the backoff policy the rows assume, the record
fields a row may set or expect, ``Case``, and the helpers that apply a row's event to a store and compare
what it answered. The rows are in tests/support/claim_rows_slots.py and claim_rows_holds.py; the tests
that run them against the Python rules, the file store and the Lua scripts in
tests/unit/stores/test_claim_cases.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from politeproxy.policy.backoff import BackoffPolicy, Kind
from politeproxy.policy.slots import HostState, Outcome
from politeproxy.stores.base import Store

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
