"""The cache rules table (policy/cacherules.py) and the size parser, without I/O."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.config.loading import ConfigError, build
from politeproxy.policy.cacherules import (
    Bypass,
    ByteRange,
    Cacheable,
    CacheLimits,
    DontKeep,
    Keep,
    accepts,
    age_seconds,
    fresh,
    parse_content_range,
    parse_range,
    request_decision,
    response_decision,
)
from politeproxy.policy.settings import parse_size

L = CacheLimits()
D = "data.commoncrawl.org"
WARC = "/crawl-data/CC-MAIN-2024-10/segments/1/warc/x.warc.gz"


def decide(method: str, host: str, path: str, headers: dict[str, str] | None = None, body: bool = False):
    return request_decision(L, method, host, path, headers or {}, body)


@pytest.mark.parametrize(
    "method,host,path,headers,want",
    [
        ("GET", D, WARC, {}, "cache"),
        ("HEAD", D, "/cc-index/table/cc-main/warc/part-0.parquet", {}, "cache"),
        ("GET", "commoncrawl.s3.amazonaws.com", WARC, {}, "cache"),
        ("GET", "commoncrawl.s3.us-east-1.amazonaws.com", WARC, {"Range": "bytes=0-99"}, "cache"),
        ("GET", "index.commoncrawl.org", "/collinfo.json", {}, "cache"),
        ("GET", "index.commoncrawl.org", "/CC-MAIN-2024-10-index", {}, "unpublished"),  # not listed: never
        ("GET", "index.commoncrawl.org", "/collinfo.json.bak", {}, None),
        ("GET", D, "/robots.txt", {}, None),
        ("GET", "example.org", WARC, {}, None),
        ("GET", "commoncrawl.s3.evil.amazonaws.com", WARC, {}, None),  # not a region
        ("POST", D, WARC, {}, "method"),
        ("GET", D, WARC + "?partNumber=2", {}, "query"),
        ("GET", D, WARC, {"If-None-Match": '"x"'}, "conditional"),
        ("GET", D, WARC, {"Cache-Control": "no-store"}, "no-store"),
        ("GET", D, WARC, {"Range": "bytes=0-1,5-9"}, "range"),
        ("GET", D, WARC, {"Range": "items=0-1"}, "range"),
        ("GET", D, "/crawl-data/../secret", {}, None),  # resolves outside the rule's prefix
    ],
)
def test_request_table(method: str, host: str, path: str, headers: dict[str, str], want: str | None) -> None:
    d = decide(method, host, path, headers)
    if want is None:
        assert d is None
    elif want == "cache":
        assert isinstance(d, Cacheable) and not d.refresh
    else:
        assert isinstance(d, Bypass) and d.reason == want


def test_keys_share_the_object_store_names_and_split_method_and_range() -> None:
    a = decide("GET", D, WARC)
    b = decide("GET", "commoncrawl.s3.amazonaws.com", WARC)
    c = decide("HEAD", D, WARC)
    r1 = decide("GET", D, WARC, {"Range": "bytes=0-99"})
    r2 = decide("GET", D, WARC, {"Range": "bytes=0-100"})
    assert isinstance(a, Cacheable) and isinstance(b, Cacheable) and a.key == b.key
    keys = {x.key for x in (a, c, r1, r2) if isinstance(x, Cacheable)}
    assert len(keys) == 4


def test_no_cache_refreshes_and_disabled_is_none() -> None:
    d = decide("GET", D, WARC, {"Cache-Control": "no-cache"})
    assert isinstance(d, Cacheable) and d.refresh
    d = decide("GET", D, WARC, {"Pragma": "no-cache"})
    assert isinstance(d, Cacheable) and d.refresh
    assert request_decision(CacheLimits(enabled=False), "GET", D, WARC, {}, False) is None


def _c(rng: str | None = None, method: str = "GET") -> Cacheable:
    d = decide(method, D, WARC, {"Range": rng} if rng else {})
    assert isinstance(d, Cacheable)
    return d


@pytest.mark.parametrize(
    "rng,status,headers,want",
    [
        (None, 200, {"Content-Length": "10"}, Keep(10)),
        (None, 200, {"Content-Length": str(64 << 20)}, Keep(64 << 20)),
        (None, 200, {"Content-Length": str((64 << 20) + 1)}, DontKeep("too-large")),
        (None, 200, {}, DontKeep("no-length")),  # chunked or close-delimited: cannot be checked
        (None, 403, {"Content-Length": "10"}, DontKeep("status")),
        (None, 503, {"Content-Length": "10"}, DontKeep("status")),
        (None, 200, {"Content-Length": "10", "Cache-Control": "private"}, DontKeep("no-store")),
        (None, 200, {"Content-Length": "10", "Cache-Control": "no-store"}, DontKeep("no-store")),
        (None, 200, {"Content-Length": "10", "Vary": "Cookie"}, DontKeep("vary")),
        (None, 206, {"Content-Length": "10", "Content-Range": "bytes 0-9/100"}, DontKeep("unasked-206")),
        ("bytes=0-9", 200, {"Content-Length": "100"}, DontKeep("range-ignored")),
        ("bytes=0-9", 206, {"Content-Length": "10", "Content-Range": "bytes 0-9/100"}, Keep(10)),
        (
            "bytes=0-9",
            206,
            {"Content-Length": "5", "Content-Range": "bytes 0-4/100"},
            DontKeep("range-mismatch"),
        ),
        (
            "bytes=0-9",
            206,
            {"Content-Length": "9", "Content-Range": "bytes 0-9/100"},
            DontKeep("range-mismatch"),
        ),
        (
            "bytes=0-9",
            206,
            {"Content-Length": "10", "Content-Range": "bytes 1-10/100"},
            DontKeep("range-mismatch"),
        ),
        (
            "bytes=0-9",
            206,
            {"Content-Length": "10", "Content-Range": "bytes 0-9/*"},
            DontKeep("range-mismatch"),
        ),
        ("bytes=0-999", 206, {"Content-Length": "100", "Content-Range": "bytes 0-99/100"}, Keep(100)),
        ("bytes=90-", 206, {"Content-Length": "10", "Content-Range": "bytes 90-99/100"}, Keep(10)),
        ("bytes=-10", 206, {"Content-Length": "10", "Content-Range": "bytes 90-99/100"}, Keep(10)),
        (
            "bytes=-10",
            206,
            {"Content-Length": "10", "Content-Range": "bytes 80-89/100"},
            DontKeep("range-mismatch"),
        ),
        (
            "bytes=0-",
            206,
            {"Content-Length": str((16 << 20) + 1), "Content-Range": f"bytes 0-{16 << 20}/{(16 << 20) + 1}"},
            DontKeep("too-large"),
        ),
    ],
)
def test_response_table(rng: str | None, status: int, headers: dict[str, str], want: object) -> None:
    assert response_decision(L, _c(rng), "GET", status, headers) == want


def test_head_stores_no_body_whatever_the_length() -> None:
    got = response_decision(L, _c(None, "HEAD"), "HEAD", 200, {"Content-Length": str(1 << 40)})
    assert got == Keep(0)


def test_collinfo_ttl_and_immutable_entries() -> None:
    assert fresh(0.0, 0.0, 1e12)  # immutable: fresh forever
    assert fresh(86400.0, 1000.0, 1000.0 + 86399.0)
    assert not fresh(86400.0, 1000.0, 1000.0 + 86400.0)
    assert not fresh(86400.0, math.nan, 1000.0)
    assert not fresh(86400.0, 1e9 + 3600, 1e9)  # stored "in the future": refetch


def test_accepts_encoding() -> None:
    assert accepts(None, "")
    assert accepts("gzip, deflate", "gzip")
    assert not accepts("deflate", "gzip")
    assert not accepts("gzip;q=0", "gzip")
    assert accepts("*", "br")


@given(st.text(max_size=80))
def test_parse_range_never_raises(s: str) -> None:
    """Any Range header text gives None or one range whose first byte is not after its last."""
    r = parse_range(s)
    assert r is None or isinstance(r, ByteRange)
    if r is not None and r.start is not None and r.end is not None:
        assert r.start <= r.end


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 10**7))
def test_expected_range_is_inside_the_object(a: int, n: int, total: int) -> None:
    """A correct 206's (first, last) for any range and object size lies within the object."""
    for r in (ByteRange(a, a + n), ByteRange(a, None), ByteRange(None, None, n)):
        got = r.expected(total)
        if got is not None:
            assert 0 <= got[0] <= got[1] < total


@given(st.text(max_size=80))
def test_parse_content_range_never_raises(s: str) -> None:
    """Any Content-Range text gives None or (first, last, total) with first <= last < total."""
    got = parse_content_range(s)
    assert got is None or got[0] <= got[1] < got[2]


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True))
def test_age_is_a_small_non_negative_int(stored: float, now: float) -> None:
    """The Age header is never negative, never non-finite, whatever a stored time says."""
    a = age_seconds(stored, now)
    assert isinstance(a, int) and 0 <= a < 2**31


@given(st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.booleans(), st.none()))
def test_parse_size_never_raises_anything_else(v: object) -> None:
    """A size from a config file is a non-negative int within bounds, or a ConfigError; never another
    exception."""
    try:
        n = parse_size(v, "cache.max_size")
    except ConfigError:
        return
    assert isinstance(n, int) and 0 <= n <= 1 << 50


def test_parse_size_units() -> None:
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512k") == 512 << 10
    assert parse_size(1000) == 1000
    for bad in ("-1", "1e9", "nan", "64 furlongs", True, 1.5):
        with pytest.raises(ConfigError):
            parse_size(bad, "k")


def test_config_keys_and_rules_override() -> None:
    c = build({}).cache()
    assert (c.enabled, c.max_object, c.max_range, c.max_size) == (True, 64 << 20, 16 << 20, 2 << 30)
    assert c.rules[1].ttl == 86400.0
    c = build({"cache": {"enabled": False, "max_size": "1MiB", "collinfo_ttl": "1h"}}).cache()
    assert (c.enabled, c.max_size, c.rules[1].ttl) == (False, 1 << 20, 3600.0)
    rules = [{"class": "x", "hosts": [D], "paths": ["/files/"]}]
    c = build({"cache": {"rules": rules}}).cache()
    assert [r.paths for r in c.rules] == [("/files/",)]
    for bad in ({"rules": [{"hosts": [D]}]}, {"max_size": "lots"}, {"surprise": 1}):
        with pytest.raises(ConfigError):
            build({"cache": bad})


@given(
    st.sampled_from(["GET", "HEAD", "POST", "get"]),
    st.sampled_from([D, "index.commoncrawl.org", "commoncrawl.s3.eu-west-1.amazonaws.com", "x.org"]),
    st.text(max_size=60).map(lambda s: "/crawl-data/" + s),
    st.dictionaries(
        st.sampled_from(["Range", "Cache-Control", "Pragma", "If-Range", "Accept-Encoding"]),
        st.text(max_size=40),
        max_size=3,
    ),
)
def test_request_decision_never_raises(method: str, host: str, path: str, headers: dict[str, str]) -> None:
    """Any path and header text a client sends gives None, a bypass reason or a key; the key is text that
    the store hashes (never a path), and a cacheable request never carries a query."""
    d = request_decision(L, method, host, path, headers, False)
    assert d is None or isinstance(d, Bypass | Cacheable)
    if isinstance(d, Cacheable):
        assert "?" not in path and d.key.startswith(("GET ", "HEAD "))


@given(
    st.sampled_from([None, "bytes=0-9", "bytes=5-", "bytes=-3"]),
    st.integers(100, 600),
    st.dictionaries(
        st.sampled_from(["Content-Length", "Content-Range", "Cache-Control", "Vary", "Set-Cookie"]),
        st.text(max_size=40),
        max_size=4,
    ),
)
def test_response_decision_never_raises(rng: str | None, status: int, headers: dict[str, str]) -> None:
    """Any upstream status and header text gives a store (with a non-negative length within the limits)
    or a reason; only a 200 or 206 is ever stored."""
    got = response_decision(L, _c(rng), "GET", status, headers)
    if isinstance(got, Keep):
        assert status in (200, 206) and 0 <= got.length <= L.max_object
    else:
        assert isinstance(got, DontKeep)


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=20),
    st.lists(st.dictionaries(st.sampled_from(["class", "hosts", "paths", "ttl", "x"]), st.text(max_size=10))),
)


@given(st.sampled_from(["enabled", "max_object", "max_range", "max_size", "collinfo_ttl", "rules"]), _ANY)
def test_cache_config_never_accepts_a_bad_value(key: str, value: object) -> None:
    """Whatever a [cache] key holds, build() refuses it with a ConfigError naming the key, or every size is
    an int within bounds and every duration finite and non-negative."""
    try:
        c = build({"cache": {key: value}}).cache()
    except ConfigError as e:
        assert f"cache.{key}" in str(e)
        return
    assert all(isinstance(n, int) and 0 <= n <= 1 << 50 for n in (c.max_object, c.max_range, c.max_size))
    assert all(math.isfinite(r.ttl) and r.ttl >= 0 for r in c.rules)


@given(st.one_of(st.none(), st.text(max_size=60)), st.text(max_size=12))
def test_accepts_never_raises(accept_encoding: str | None, coding: str) -> None:
    """Any Accept-Encoding text gives a yes or no for any stored coding; identity is always accepted."""
    assert isinstance(accepts(accept_encoding, coding), bool)
    assert accepts(accept_encoding, "identity") and accepts(accept_encoding, "")
