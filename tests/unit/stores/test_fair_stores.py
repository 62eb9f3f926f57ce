"""The fair turn in each shared store (issue 27 item 1): the same asks from two "proxies" get the same
answers from the MemoryStore (``policy.fairclaim`` in Python), two FileStore on one directory (the same
Python under the flock, its state in the ``fair`` record) and two RedisStore on one server (the Lua in
stores/redis_fair_lua.py, on every server kind). Then untrusted fair records: any bytes in the file, any
fields in the hash, never raise and answer within bounds.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from politeproxy.policy.fairclaim import RETRY_MAX, FairAsk
from politeproxy.policy.slots import Outcome
from politeproxy.stores.base import Store
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore
from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.store_helpers import H

GAP = 0.001  # a short gap: 90 grants reserve under 0.1 s ahead, well inside MAX_WAIT
MAX_WAIT = 10.0
OWNED = {"A": ["x"], "B": ["y", "z"]}  # x alone on proxy A; y and z on proxy B

redis_one = redis_fixture("redis_one", scope="module")  # the system redis-server

Decision = tuple[str, str, str, str]  # proxy, pipeline asked, outcome, turn named


async def _run(stores: dict[str, Store], weights: dict[str, float], grants: int) -> list[Decision]:
    """A and B ask in turn, each for the head of its own rotation, following the turn the store names
    when it is one of theirs (as pacing/dispatcher.py does)."""
    heads = {proxy: 0 for proxy in OWNED}
    log: list[Decision] = []
    granted = 0
    while granted < grants and len(log) < 10 * grants:
        for proxy, mine in OWNED.items():
            p = mine[heads[proxy] % len(mine)]
            ask = FairAsk(p, weights[p], proxy, tuple(mine))
            c = await stores[proxy].claim(H, GAP, 0.0, MAX_WAIT, fair=ask)
            log.append((proxy, p, c.outcome.value, c.turn))
            if c.granted:
                granted += 1
                heads[proxy] += 1
            else:
                assert c.outcome is Outcome.NOT_YOUR_TURN, c
                assert 0 < c.wait <= RETRY_MAX, c  # asks again soon: the turn may move
                if c.turn in mine:
                    heads[proxy] = mine.index(c.turn)
    return log


def _served(log: list[Decision]) -> Counter[str]:
    return Counter(p for _, p, outcome, _ in log if outcome == Outcome.GRANTED.value)


async def _with(make: Callable[[], Store], weights: dict[str, float], grants: int) -> list[Decision]:
    a, b = make(), make()
    try:
        return await _run({"A": a, "B": b}, weights, grants)
    finally:
        await a.close()
        await b.close()


async def _memory(weights: dict[str, float], grants: int) -> list[Decision]:
    one = MemoryStore()  # one process: both "proxies" share the one object
    return await _run({"A": one, "B": one}, weights, grants)


EQUAL = {"x": 1.0, "y": 1.0, "z": 1.0}
WEIGHTED = {"x": 2.0, "y": 1.0, "z": 1.0}


async def test_memory_gives_each_pipeline_its_share_across_proxies() -> None:
    # Without the fair turn B's two pipelines would get 2/3 of the slots between them and x 1/3... as
    # slots alternate between proxies, x would get 1/2. The turn gives each pipeline 1/3.
    got = _served(await _memory(EQUAL, 90))
    assert all(abs(got[p] - 30) <= 1 for p in EQUAL), got
    got = _served(await _memory(WEIGHTED, 80))
    assert abs(got["x"] - 40) <= 1 and abs(got["y"] - 20) <= 1 and abs(got["z"] - 20) <= 1, got


@pytest.mark.parametrize("weights", [EQUAL, WEIGHTED], ids=["equal", "weighted"])
async def test_two_file_stores_answer_as_the_memory_store(weights: dict[str, float], tmp_path: Path) -> None:
    want = await _memory(weights, 60)
    assert await _with(lambda: FileStore(tmp_path), weights, 60) == want


@pytest.mark.parametrize("weights", [EQUAL, WEIGHTED], ids=["equal", "weighted"])
async def test_two_redis_stores_answer_as_the_memory_store(
    weights: dict[str, float], server: RedisServer
) -> None:
    """The Lua against the Python, on every server kind (``server`` from tests/unit/conftest.py)."""
    want = await _memory(weights, 60)
    prefix = f"pp-fair-{uuid.uuid4().hex[:8]}:"
    assert await _with(lambda: RedisStore(server.url, prefix=prefix), weights, 60) == want


# The asks of the test below: (store, pipeline, proxy, its backlog), and what each is answered.
DROP_Z = [
    ("a", "x", "A", ("x",), "granted", "x"),
    ("b", "y", "B", ("y", "z"), "granted", "y"),  # z is ready on B too
    ("a", "x", "A", ("x",), "not_your_turn", "z"),  # z, never served, has the smallest start
    ("b", "y", "B", ("y",), "granted", "y"),  # z's last request left: its mark goes with it
    ("a", "x", "A", ("x",), "granted", "x"),  # ... so x waits for nobody idle
    ("b", "z", "B", ("z",), "granted", "z"),  # z back: it starts at V (it banked no credit while idle)
]


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_a_pipeline_whose_last_request_left_stops_counting(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    a: Store
    b: Store
    if kind == "memory":
        a = b = MemoryStore()
    elif kind == "file":
        a, b = FileStore(tmp_path), FileStore(tmp_path)
    else:
        url = request.getfixturevalue("redis_one").url
        prefix = f"pp-fair-{uuid.uuid4().hex[:8]}:"
        a, b = RedisStore(url, prefix=prefix), RedisStore(url, prefix=prefix)
    stores = {"a": a, "b": b}
    try:
        for which, p, proxy, backlog, outcome, turn in DROP_Z:
            c = await stores[which].claim(H, GAP, 0.0, MAX_WAIT, fair=FairAsk(p, 1.0, proxy, backlog))
            assert (c.outcome.value, c.turn or p) == (outcome, turn), (p, proxy, backlog, c)
    finally:
        await a.close()
        await b.close()


# -- untrusted records ----------------------------------------------------------------------------------


def _hostile_json() -> st.SearchStrategy[bytes]:
    num = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), st.text(max_size=4)
    )
    name = st.one_of(st.text(max_size=70), st.integers(), st.none())
    doc = st.fixed_dictionaries(
        {},
        optional={
            "v": num,
            "f": st.one_of(st.dictionaries(st.text(max_size=70), num, max_size=6), num),
            "m": st.one_of(st.lists(st.lists(st.one_of(name, num), max_size=4), max_size=6), num),
        },
    )
    return st.one_of(st.binary(max_size=300), doc.map(lambda d: json.dumps(d).encode()))


def _bounded(wait: float) -> bool:
    return math.isfinite(wait) and 0 <= wait <= MAX_WAIT + 1


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_hostile_json())
def test_any_fair_file_never_raises_and_answers_in_bounds(tmp_path: Path, data: bytes) -> None:
    d = tmp_path / uuid.uuid4().hex
    d.mkdir()
    (d / "fair").write_bytes(data)
    asyncio.run(_hostile_file(d))


async def _hostile_file(d: Path) -> None:
    s = FileStore(d)
    try:
        for p in ("x", "y", "x"):
            c = await s.claim(H, GAP, 0.0, MAX_WAIT, fair=FairAsk(p, 1.0, "A", ("x", "y")))
            assert c.outcome in (Outcome.GRANTED, Outcome.NOT_YOUR_TURN) and _bounded(c.wait), c
    finally:
        await s.close()


fields = st.dictionaries(
    st.one_of(
        st.sampled_from(["v", "f:x", "f:y", "m:B:y", "m:A:x", "m::y", "m:B:", "m:B", "f:"]),
        st.text(max_size=12),
    ),
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e300", "2.5", "0x7fffffff", "", "x"]),
    min_size=1,
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields)
def test_any_fair_hash_never_raises_and_answers_in_bounds(
    server: RedisServer, garbage: dict[str, str]
) -> None:
    asyncio.run(_hostile_hash(server, garbage))


async def _hostile_hash(server: RedisServer, garbage: dict[str, str]) -> None:
    s = RedisStore(server.url, prefix=f"pp-fair-{uuid.uuid4().hex[:8]}:")
    raw = aioredis.from_url(server.url)
    try:
        await raw.hset(s.fair_key, mapping=garbage)  # type: ignore[arg-type]
        for p in ("x", "y", "x"):
            c = await s.claim(H, GAP, 0.0, MAX_WAIT, fair=FairAsk(p, 1.0, "A", ("x", "y")))
            assert c.outcome in (Outcome.GRANTED, Outcome.NOT_YOUR_TURN) and _bounded(c.wait), c
        assert 0 < await raw.pttl(s.fair_key) <= 2 * 60_000 + 1000  # the record expires by itself
    finally:
        await raw.aclose()
        await s.close()
