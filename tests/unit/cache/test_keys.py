"""The cache key (policy/cacherules.request_decision, issue 25): scheme, port and the exact target."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.cacherules import Bypass, Cacheable, CacheLimits, request_decision

L = CacheLimits()
D = "data.commoncrawl.org"
S3 = "commoncrawl.s3.amazonaws.com"
BASE = "/crawl-data/CC-MAIN-2024-10/"


def key(path: str, host: str = D, scheme: str = "https", port: int = 443) -> str:
    d = request_decision(L, "GET", host, path, {}, False, scheme=scheme, port=port)
    assert isinstance(d, Cacheable), d
    return d.key


def test_cleartext_is_never_cached_nor_refreshed() -> None:
    for headers in ({}, {"Cache-Control": "no-cache"}):
        d = request_decision(L, "GET", D, BASE + "x", headers, False, scheme="http", port=80)
        assert d == Bypass("cleartext")


def test_the_port_is_part_of_the_key_and_the_bucket_shares_with_data() -> None:
    assert key(BASE + "x") != key(BASE + "x", port=8443)
    assert key(BASE + "x") == key(BASE + "x", host=S3)  # the documented sharing


@pytest.mark.parametrize("a,b", [("%FF", "%FE"), ("x%C0", "x%EF%BF%BD"), ("%41", "A"), ("a%2Fb", "a/b")])
def test_escape_pairs_are_distinct_keys(a: str, b: str) -> None:
    assert key(BASE + a) != key(BASE + b)


@given(st.text(max_size=30), st.text(max_size=30))
def test_distinct_targets_are_distinct_keys(a: str, b: str) -> None:
    """Whatever the two targets hold (spaces, quotes, brackets), only equal targets share a key."""
    da, db = (request_decision(L, "GET", D, BASE + x, {}, False) for x in (a, b))
    if isinstance(da, Cacheable) and isinstance(db, Cacheable):  # not a query, not outside the rule
        assert (da.key == db.key) == (a == b)
