"""Kept index answers read back from Redis (cache/redis_answers.py ``parse_kept``): records are untrusted,
so anything but the expected shape is a miss, never an exception."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from politeproxy.cache.redis_answers import Kept, parse_kept

KEY = 'GET ["https", "index", 443, "/CC-MAIN-2024-33-index?url=a.com", "*"]'


def head(**kw: object) -> bytes:
    base: dict[str, object] = {
        "key": KEY,
        "status": 200,
        "headers": [["Content-Type", "text/x-ndjson"], ["Content-Length", "3"]],
        "length": 3,
        "stored": 1.7e9,
    }
    base.update(kw)
    return json.dumps(base).encode()


def test_a_good_record_and_each_way_it_is_not() -> None:
    kept = parse_kept(KEY, head(), b"abc")
    assert kept == Kept(200, [("Content-Type", "text/x-ndjson"), ("Content-Length", "3")], b"abc", 1.7e9)
    assert parse_kept(KEY, head(status=404), b"abc") is not None  # a kept "No Captures found"
    bad = [
        (head(key="GET other"), b"abc"),  # names another key
        (head(), b"ab"),  # a body not of its length
        (head(status=500), b"abc"),
        (head(status=True), b"abc"),
        (head(stored=float("nan")), b"abc"),
        (head(stored="x"), b"abc"),
        (head(headers="x"), b"abc"),
        (head(headers=[["a", 1]]), b"abc"),
        (b"{", b"abc"),
        (b"\xff", b"abc"),
        (None, b"abc"),
        (head(), None),
    ]
    for h, body in bad:
        assert parse_kept(KEY, h, body) is None, h
    odd = parse_kept(KEY, head(headers=[["Set-Cookie", "x"], ["Content-Type", "a\x00"]]), b"abc")
    assert odd is not None and odd.headers == []  # only the stored headers, printable


@given(st.one_of(st.none(), st.binary(max_size=200)), st.one_of(st.none(), st.binary(max_size=20)))
def test_parse_kept_never_raises(h: bytes | None, body: bytes | None) -> None:
    out = parse_kept(KEY, h, body)
    assert out is None or (
        out.status in (200, 404) and isinstance(body, bytes) and len(out.body) == len(body)
    )


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda k: st.lists(k, max_size=4) | st.dictionaries(st.text(max_size=8), k, max_size=6),
        max_leaves=20,
    )
)
def test_parse_kept_of_any_json_never_raises(doc: object) -> None:
    try:
        raw = json.dumps(doc).encode()
    except ValueError:
        return
    assert parse_kept(KEY, raw, b"abc") is None or isinstance(doc, dict)


async def test_redis_down_is_a_miss_and_is_left_alone_for_a_while() -> None:
    import socket
    import time

    import redis.asyncio as aioredis

    from politeproxy.cache.redis_answers import DOWN_FOR, RedisAnswers

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = aioredis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5, socket_timeout=0.5)
    answers = RedisAnswers(client, "t:", 1 << 20, 1 << 20)
    try:
        assert await answers.get(KEY) is None
        assert await answers.take_lease(KEY) is None  # cannot say: the data dir's lease decides
        t0 = time.monotonic()
        assert await answers.put(KEY, 200, [], b"abc", 1.0) == 0
        assert await answers.get(KEY) is None
        assert time.monotonic() - t0 < 0.1 < DOWN_FOR  # not asked again meanwhile: no wait
    finally:
        await client.aclose()
