"""Issue 43's rules without I/O: which CDX answers of the index server are kept and under which key
(policy/cacherules.py), the published crawls read from collinfo.json (a parser of untrusted bytes), and
how long the index service rests after a warning (policy/indexanswers.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.cacherules import (
    UNKNOWN,
    Bypass,
    Cacheable,
    CacheLimits,
    DontKeep,
    Keep,
    entry_ttl,
    fresh,
    keeps_body,
    request_decision,
    response_decision,
)
from politeproxy.policy.indexanswers import crawl_of, index_rest, is_warning, published_crawls

L = CacheLimits()
IX = "index.commoncrawl.org"
CRAWL = "CC-MAIN-2024-33"
Q = f"/{CRAWL}-index?url=example.com/*&output=json"
PUBLISHED = frozenset({CRAWL})
CHUNKED = {"Content-Type": "text/x-ndjson", "Transfer-Encoding": "chunked"}


def ask(path: str, published: frozenset[str] = PUBLISHED, method: str = "GET", **headers: str):
    return request_decision(L, method, IX, path, headers, False, published=published)


def kept(status: int, headers: dict[str, str]) -> Keep | DontKeep:
    c = ask(Q)
    assert isinstance(c, Cacheable)
    return response_decision(L, c, "GET", status, headers)


def test_a_question_about_a_published_crawl_is_kept_under_its_exact_target() -> None:
    a, b = ask(Q), ask(f"/{CRAWL}-index?output=json&url=example.com/*")
    assert isinstance(a, Cacheable) and isinstance(b, Cacheable)
    assert a.rule.cdx and a.key != b.key  # parameter order matters: two entries
    assert f"/{CRAWL}-index?url=example.com/*&output=json" in a.key
    pages = [ask(f"/{CRAWL}-index?url=example.com/*&showNumPages=true"), ask(f"{Q}&page=3")]
    assert all(isinstance(p, Cacheable) for p in pages)  # showNumPages and every page


@pytest.mark.parametrize(
    "path,published,method,headers,reason",
    [
        (Q, frozenset(), "GET", {}, "unpublished"),  # collinfo.json does not list it (yet)
        ("/CC-MAIN-2099-10-index?url=a.com", PUBLISHED, "GET", {}, "unpublished"),
        (Q, PUBLISHED, "POST", {}, "method"),
        (Q, PUBLISHED, "HEAD", {}, "method"),
        (Q, PUBLISHED, "GET", {"Range": "bytes=0-9"}, "range"),
        (Q, PUBLISHED, "GET", {"If-None-Match": '"x"'}, "conditional"),
        (Q, PUBLISHED, "GET", {"Cache-Control": "no-store"}, "no-store"),
    ],
)
def test_questions_never_kept(
    path: str, published: frozenset[str], method: str, headers: dict, reason: str
) -> None:
    d = ask(path, published, method, **headers)
    assert isinstance(d, Bypass) and d.reason == reason


def test_other_queries_still_bypass_and_other_index_paths_are_not_the_caches() -> None:
    data = request_decision(
        L, "GET", "data.commoncrawl.org", "/crawl-data/x.gz?a=1", {}, False, published=PUBLISHED
    )
    assert isinstance(data, Bypass) and data.reason == "query"
    assert ask("/collinfo.json?x=1") == Bypass("query")
    assert ask("/CC-MAIN-2024-33/20240101/https://example.com/") is None  # pywb's replay: not kept
    off = request_decision(CacheLimits(index_answers=False), "GET", IX, Q, {}, False, published=PUBLISHED)
    assert off is None


@pytest.mark.parametrize(
    "status,headers,want",
    [
        (200, CHUNKED, Keep(UNKNOWN)),  # pywb streams: kept once it ends, if it holds a line
        (200, {"Content-Length": "120"}, Keep(120)),
        (200, {"Content-Length": "0"}, DontKeep("empty")),  # pywb's empty 200 of a failed backend
        (404, {"Content-Length": "30"}, Keep(30)),  # "No Captures found": kept for index_miss_ttl
        (400, {"Content-Length": "30"}, DontKeep("status")),  # no more pages
        (503, {}, DontKeep("status")),
        (500, CHUNKED, DontKeep("status")),
        (206, {"Content-Length": "1"}, DontKeep("status")),
        (200, {"Content-Length": "x"}, DontKeep("no-length")),
        (200, {"Content-Length": str(L.max_object + 1)}, DontKeep("too-large")),
        (200, {**CHUNKED, "Cache-Control": "no-store"}, DontKeep("no-store")),
        (200, {**CHUNKED, "Set-Cookie": "a=b"}, DontKeep("vary")),
    ],
)
def test_which_answers_are_kept(status: int, headers: dict[str, str], want: object) -> None:
    assert kept(status, headers) == want


def test_a_200_is_kept_only_with_a_capture_line_and_a_404_for_a_time_of_its_own() -> None:
    c = ask(Q)
    assert isinstance(c, Cacheable)
    assert not keeps_body(c, 200, has_text=False)  # an empty or whitespace-only body
    assert keeps_body(c, 200, has_text=True) and keeps_body(c, 404, has_text=False)
    assert entry_ttl(L, c.rule, 200) == 0.0  # immutable
    assert entry_ttl(L, c.rule, 404) == 86400.0
    assert fresh(entry_ttl(L, c.rule, 404), 1000.0, 1000.0 + 86399) and not fresh(86400.0, 1000.0, 87401.0)
    never = CacheLimits(index_miss_ttl=0.0)
    c0 = request_decision(never, "GET", IX, Q, {}, False, published=PUBLISHED)
    assert isinstance(c0, Cacheable) and response_decision(never, c0, "GET", 404, {}) == DontKeep("status")


def test_crawl_of_and_collinfo() -> None:
    assert crawl_of("/CC-MAIN-2024-33-index") == CRAWL
    assert (
        crawl_of("/collinfo.json") is None and crawl_of("/a/b-index") is None and crawl_of("/-index") is None
    )
    body = json.dumps([{"id": CRAWL, "cdx-api": "x"}, {"id": "../etc"}, {"id": 5}, "CC-MAIN-2020-10", {}])
    assert published_crawls(body.encode()) == {CRAWL}
    for bad in (b"", b"{}", b"[", b"\xff", b"null", b"[[[[" * 1000 + b"]]]]" * 1000):
        assert published_crawls(bad) == frozenset()


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_published_crawls_never_raises(body: bytes) -> None:
    out = published_crawls(body)
    assert all(crawl_of(f"/{c}-index") == c for c in out)


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=20),
        lambda k: st.lists(k) | st.dictionaries(st.text(max_size=5), k),
        max_leaves=30,
    )
)
def test_published_crawls_of_any_json_never_raises(doc: object) -> None:
    out = published_crawls(json.dumps(doc).encode())
    assert isinstance(out, frozenset) and len(out) <= 30


def test_warnings() -> None:
    assert is_warning(None) and is_warning(502) and is_warning(503) and is_warning(504)
    assert not is_warning(500) and not is_warning(404) and not is_warning(200) and not is_warning(429)


@pytest.mark.parametrize(
    "first,retry_after,backoff,warnings,want",
    [
        (60.0, None, 1.0, 1, 60.0),  # the setting, though today's backoff is 1 s
        (60.0, 90.0, 1.0, 1, 90.0),  # a longer Retry-After wins
        (60.0, 5.0, 1.0, 1, 60.0),  # a shorter one does not
        (60.0, None, 200.0, 1, 200.0),  # a longer backoff wins
        (60.0, None, 2.0, 2, 120.0),  # a later warning doubles it
        (60.0, None, 4.0, 3, 240.0),
        (60.0, None, 8.0, 9, 300.0),  # up to the cap
        (600.0, None, 1.0, 1, 600.0),  # never below the setting, whatever the cap
        (0.0, 90.0, 1.0, 1, 0.0),  # off
        (60.0, None, 1.0, 0, 60.0),  # a count the store lost: the first
    ],
)
def test_index_rest(
    first: float, retry_after: float | None, backoff: float, warnings: int, want: float
) -> None:
    assert index_rest(first, retry_after, backoff, warnings, 300.0) == want


@given(
    st.floats(allow_nan=True),
    st.none() | st.floats(0, 86400),
    st.floats(allow_nan=True),
    st.integers(-5, 10**6),
)
def test_index_rest_is_bounded(first: float, ra: float | None, backoff: float, warnings: int) -> None:
    r = index_rest(first, ra, backoff, warnings, 300.0)
    assert r == 0.0 or (first <= r <= max(300.0, first))


@given(
    st.text(max_size=40) | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    st.text(max_size=60),
    st.sampled_from(["GET", "HEAD", "POST"]),
    st.dictionaries(st.sampled_from(["Range", "Cache-Control", "If-None-Match", "X"]), st.text(max_size=10)),
)
def test_index_questions_never_raise_and_keep_the_exact_target(
    crawl: str, query: str, method: str, headers: dict[str, str]
) -> None:
    target = f"/{crawl}-index?{query}"
    d = request_decision(L, method, IX, target, headers, False, published=frozenset({crawl}))
    if isinstance(d, Cacheable):
        assert d.rule.cdx and method == "GET" and json.dumps(target, ensure_ascii=False)[1:-1] in d.key
        assert crawl_of(f"/{crawl}-index") == crawl  # only a name a CDX path carries
