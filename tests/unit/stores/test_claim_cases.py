"""One table of (state, event) -> expected state, run against the Python rules (MemoryStore and FileStore
over ``StateMachine``: ``slots.claim``, ``slots.exempt_claim``, the sanity bounds, ``backoff.answer_delay``)
AND the Redis Lua scripts, so they cannot drift. Times in the table are seconds relative to the store's
now (the rows: tests/support/claim_rows_*.py). The scripts against what no row can express (a cancellation
between round trips, stray values from HSET, a record corrupted mid-run): test_redis_script_edges.py."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from politeproxy.policy.slots import HostState
from politeproxy.stores.file import FileStore
from politeproxy.stores.file_records import GLOBAL, encode_host, host_file_name
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.claim_rows_holds import HOLD_ROWS
from tests.support.claim_rows_slots import SLOT_ROWS
from tests.support.claim_table import (
    ABSENT,
    COUNTS,
    DURATIONS,
    NOW,
    TIMES,
    Case,
    H,
    check,
    host_state,
    observed,
    run_event,
)
from tests.support.redis_server import RedisServer

CASES = SLOT_ROWS + HOLD_ROWS
IDS = [c.name for c in CASES]


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
        # The script read its own TIME somewhere in between: its times may differ from ours by that much.
        sec2, usec2 = await raw.time()
        elapsed = (sec2 * 1_000_000 + usec2 - now_us) / 1e6
        g = await raw.hgetall(store.global_key)
        h = await raw.hgetall(store.host_key(H))
        for key in TIMES:
            t = float((g if key == "next" else h).get(key, 0))
            got[key] = (t - now_us) / 1e6 if t else ABSENT
        got |= {k: int(float(h.get(k, 0))) for k in COUNTS}
        got |= {k: float(h.get(k, 0)) / 1e6 for k in DURATIONS}
        check(case, got, max(0.05, elapsed + 0.005))
    finally:
        await store.close()
