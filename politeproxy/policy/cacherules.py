"""What the shared disk cache may keep, under which key, and whether an answer may be stored (no I/O).

A table of ``CacheRule``s says which host class and path prefixes hold immutable objects (and the one
file with a TTL, ``collinfo.json``). ``request_decision`` turns a request into a key or a bypass reason,
``response_decision`` says whether the upstream's answer to it may be stored. Both are pure: the cache
layer (politeproxy/cache) does the I/O, and tests/unit/policy/test_cacherules.py runs them without it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from politeproxy.policy.classify import normalize_path
from politeproxy.policy.hosts import BUCKET_HOSTS, host_matches
from politeproxy.policy.indexanswers import crawl_of
from politeproxy.policy.table import Sections, default, from_table, table_values


@dataclass(frozen=True)
class CacheRule:
    """Requests to one of ``hosts`` whose path starts with one of ``paths`` (or equals it, ``exact``).

    ``host_class`` is the key's host part: names that serve the same objects share it (CloudFront's
    data.commoncrawl.org and the bucket's S3 names). ``ttl`` 0 means immutable; ``ranges`` allows 206s.
    """

    host_class: str
    hosts: tuple[str, ...]
    paths: tuple[str, ...]
    exact: bool = False
    ttl: float = 0.0
    ranges: bool = True
    cdx: bool = False  # the index server's CDX API answers (issue 43): queries kept, by the crawl's list

    def matches(self, host: str, path: str) -> bool:
        return any(host_matches(host, h) for h in self.hosts) and self.path_matches(path)

    def path_matches(self, path: str) -> bool:
        if self.exact:
            return path in self.paths
        return any(path.startswith(p) for p in self.paths)


@functools.lru_cache(maxsize=4096)  # bounded: host names are the client's choice
def rules_for(rules: tuple[CacheRule, ...], host: str) -> tuple[CacheRule, ...]:
    """The rules whose hosts match ``host``: host matching once per name, not per request (issue 15)."""
    return tuple(r for r in rules if any(host_matches(host, h) for h in r.hosts))


DATA_HOSTS = ("data.commoncrawl.org", *BUCKET_HOSTS)  # the data distribution and every name of the bucket


def default_rules(collinfo_ttl: float = default("cache.collinfo_ttl")) -> tuple[CacheRule, ...]:
    """Everything published under /crawl-data/, /cc-index/ and the host index (/projects/host-index*), and
    the index server's collinfo.json only: its query answers can be an empty 200 while its backend is down."""
    return (
        CacheRule("data", DATA_HOSTS, ("/crawl-data/", "/cc-index/", "/projects/host-index")),
        CacheRule("index", ("index.commoncrawl.org",), ("/collinfo.json",), exact=True, ttl=collinfo_ttl),
    )


INDEX_HOSTS = ("index.commoncrawl.org",)
# CDX API answers: kept under the exact target (query included) when their crawl is published (issue 43)
CDX_RULE = CacheRule("index", INDEX_HOSTS, (), ranges=False, cdx=True)


@dataclass(frozen=True)
class CacheLimits:
    """What the shared cache keeps: the [cache] section, its rules built (the default table without any)."""

    enabled: bool = from_table("cache.enabled")
    max_object: int = from_table("cache.max_object")
    max_range: int = from_table("cache.max_range")
    max_size: int = from_table("cache.max_size")
    rules: tuple[CacheRule, ...] = default_rules()
    index_answers: bool = from_table("cache.index_answers")
    index_miss_ttl: float = from_table("cache.index_miss_ttl")
    index_redis_max_answer: int = from_table("cache.index_redis_max_answer")  # on the redis store (issue 43)
    index_redis_max_size: int = from_table("cache.index_redis_max_size")

    @classmethod
    def of(cls, sections: Sections, rules: tuple[CacheRule, ...]) -> CacheLimits:
        return cls(**table_values(cls, sections), rules=rules)


@dataclass(frozen=True)
class ByteRange:
    """One range of ``Range: bytes=...``: ``start``-``end`` (end None: to the end), or a ``suffix``."""

    start: int | None
    end: int | None
    suffix: int | None = None

    def text(self) -> str:
        if self.suffix is not None:
            return f"-{self.suffix}"
        return f"{self.start}-{'' if self.end is None else self.end}"

    def expected(self, total: int) -> tuple[int, int] | None:
        """The (first, last) byte a correct 206 carries for an object of ``total`` bytes, None if none."""
        if total <= 0:
            return None
        if self.suffix is not None:
            return (max(0, total - self.suffix), total - 1) if self.suffix > 0 else None
        assert self.start is not None
        if self.start >= total:
            return None
        last = total - 1 if self.end is None else min(self.end, total - 1)
        return self.start, last


_DIGITS = r"[0-9]{1,18}"  # ASCII only and bounded: at most an exabyte, never a huge int parse
_RANGE = re.compile(rf"bytes[ \t]*=[ \t]*(?:({_DIGITS})-({_DIGITS})?|-({_DIGITS}))[ \t]*", re.IGNORECASE)
_CONTENT_RANGE = re.compile(rf"bytes[ \t]+({_DIGITS})-({_DIGITS})/({_DIGITS}|\*)[ \t]*", re.IGNORECASE)
_LENGTH = re.compile(r"[ \t]*[0-9]{1,18}[ \t]*")


def parse_range(value: str) -> ByteRange | None:
    """A single satisfiable-looking byte range, else None (several ranges, garbage, first > last)."""
    m = _RANGE.fullmatch(value)
    if m is None:
        return None
    if m.group(3) is not None:
        return ByteRange(None, None, int(m.group(3)))
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) is not None else None
    if end is not None and end < start:
        return None
    return ByteRange(start, end)


def parse_content_range(value: str) -> tuple[int, int, int] | None:
    """(first, last, total) of ``Content-Range: bytes a-b/n``; None when unknown total or inconsistent."""
    m = _CONTENT_RANGE.fullmatch(value)
    if m is None or m.group(3) == "*":
        return None
    first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if first > last or last >= total:
        return None
    return first, last, total


def parse_length(value: str | None) -> int | None:
    """A Content-Length of ASCII digits, else None."""
    if value is None or not _LENGTH.fullmatch(value):
        return None
    return int(value)


def _directives(value: str | None) -> set[str]:
    return {p.split("=", 1)[0].strip().lower() for p in (value or "").split(",") if p.strip()}


@dataclass(frozen=True)
class Cacheable:
    """A request the cache may answer: its key text, rule and range; ``refresh`` for a client no-cache."""

    key: str
    rule: CacheRule
    range: ByteRange | None
    refresh: bool = False


@dataclass(frozen=True)
class Bypass:
    reason: str


CONDITIONAL = ("If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since", "If-Range")


def request_decision(
    limits: CacheLimits,
    method: str,
    host: str,
    raw_path: str,
    headers: Mapping[str, str],
    has_body: bool,
    scheme: str = "https",
    port: int = 443,
    published: Collection[str] = (),
) -> Cacheable | Bypass | None:
    """None when no rule covers the request (not the cache's business); else a key or why not.

    The rule matches the normalised path (what the server resolves); the key holds the target exactly as
    it goes upstream (``raw_path``: no percent-decoding, no case folding, no dot-segment removal), so two
    spellings are two entries and one object is never served as another. A query string makes it another
    request (S3's ``partNumber``, presigned URLs): never cached, except the index server's CDX API
    (``cdx_decision``: a question about a crawl in ``published``, the crawls collinfo.json lists, is kept
    under its exact target). Only ``https`` is cached: a cleartext answer may come from anyone on the path,
    so it is neither stored nor served from the cache (and its ``no-cache`` replaces nothing). The key
    names the scheme and the port: an entry is served only to a request for the same object on them."""
    if not limits.enabled:
        return None
    if limits.index_answers and any(host_matches(host, h) for h in INDEX_HOSTS):
        c = cdx_decision(limits, method, raw_path, headers, has_body, scheme, port, published)
        if c is not None:
            return c
    rules = rules_for(limits.rules, host)
    if not rules:
        return None
    path = normalize_path(raw_path)
    rule = next((r for r in rules if r.path_matches(path)), None)
    if rule is None:
        return None
    if scheme != "https":
        return Bypass("cleartext")
    if method not in ("GET", "HEAD"):
        return Bypass("method")
    if "?" in raw_path or "#" in raw_path or has_body:
        return Bypass("query" if "?" in raw_path else "body")
    if any(h in headers for h in CONDITIONAL):
        return Bypass("conditional")
    cc = _directives(headers.get("Cache-Control")) | _directives(headers.get("Pragma"))
    if "no-store" in cc:
        return Bypass("no-store")
    rng: ByteRange | None = None
    raw_range = headers.get("Range")
    if raw_range is not None:
        rng = parse_range(raw_range)
        if rng is None or not rule.ranges:
            return Bypass("range")
    return Cacheable(
        cache_key(method, rule.host_class, port, raw_path, rng), rule, rng, refresh="no-cache" in cc
    )


def cdx_decision(
    limits: CacheLimits,
    method: str,
    raw_path: str,
    headers: Mapping[str, str],
    has_body: bool,
    scheme: str,
    port: int,
    published: Collection[str],
) -> Cacheable | Bypass | None:
    """A CDX API question (``/<crawl>-index?...``) to the index server: kept under its exact raw target,
    parameter order and all (``?url=a&page=1`` and ``?page=1&url=a`` are two entries), when its crawl is
    in ``published``; a crawl not (yet) listed is never kept. None when the path is not the CDX API."""
    path, _, _query = raw_path.partition("?")
    crawl = crawl_of(path)
    if crawl is None:
        return None
    if scheme != "https":
        return Bypass("cleartext")
    if method != "GET" or has_body or "#" in raw_path:
        return Bypass("method" if method != "GET" else "body")
    if any(h in headers for h in CONDITIONAL) or "Range" in headers:
        return Bypass("conditional" if "Range" not in headers else "range")
    cc = _directives(headers.get("Cache-Control")) | _directives(headers.get("Pragma"))
    if "no-store" in cc:
        return Bypass("no-store")
    if crawl not in published:
        return Bypass("unpublished")
    return Cacheable(
        cache_key(method, CDX_RULE.host_class, port, raw_path, None), CDX_RULE, None, "no-cache" in cc
    )


def cache_key(method: str, host_class: str, port: int, raw_path: str, rng: ByteRange | None) -> str:
    """The key text (hashed by the store, never a path): the method, then a JSON list of the scheme, the
    host class (the names that serve the same objects), the port, the exact target and the range. JSON
    keeps the fields apart whatever a client puts in its target."""
    fields = ["https", host_class, port, raw_path, rng.text() if rng else "*"]
    return f"{method} {json.dumps(fields, ensure_ascii=False)}"


@dataclass(frozen=True)
class Keep:
    """Keep the answer: ``length`` body bytes are expected (0 for a HEAD)."""

    length: int


@dataclass(frozen=True)
class DontKeep:
    reason: str


def response_decision(
    limits: CacheLimits, c: Cacheable, method: str, status: int, headers: Mapping[str, str]
) -> Keep | DontKeep:
    """Whether the upstream's answer to ``c`` may be kept: only a 200, or a 206 that is exactly the
    requested single range, with a Content-Length within the limits, not no-store/private, not varying.
    A CDX answer: ``cdx_response``."""
    if c.rule.cdx:
        return cdx_response(limits, status, headers)
    if status not in (200, 206):
        return DontKeep("status")
    if (refused := _forbidden(headers)) is not None:
        return refused
    length = parse_length(headers.get("Content-Length"))
    if length is None:
        return DontKeep("no-length")
    if status == 200:
        if c.range is not None:
            return DontKeep("range-ignored")  # a 200 to a Range request: the whole object, not the key's
        if method == "GET" and length > limits.max_object:
            return DontKeep("too-large")
        return Keep(0 if method == "HEAD" else length)
    if c.range is None:
        return DontKeep("unasked-206")
    cr = parse_content_range(headers.get("Content-Range", ""))
    want = c.range.expected(cr[2]) if cr is not None else None
    if cr is None or want is None or (cr[0], cr[1]) != want or length != cr[1] - cr[0] + 1:
        return DontKeep("range-mismatch")
    if method == "GET" and length > limits.max_range:
        return DontKeep("too-large")
    return Keep(0 if method == "HEAD" else length)


def _forbidden(headers: Mapping[str, str]) -> DontKeep | None:
    """An answer that says not to keep it (no-store, private, no-cache), or that varies beyond encoding."""
    if _directives(headers.get("Cache-Control")) & {"no-store", "private", "no-cache"}:
        return DontKeep("no-store")
    if "Set-Cookie" in headers or _directives(headers.get("Vary")) - {"accept-encoding"}:
        return DontKeep("vary")
    return None


def cdx_response(limits: CacheLimits, status: int, headers: Mapping[str, str]) -> Keep | DontKeep:
    """A CDX answer may be kept when it is a 200 (its body must then hold a capture line: ``keeps_body``)
    or pywb's "No Captures found" 404 (kept index_miss_ttl; 0: never); anything else, never. pywb streams
    its answers: no Content-Length is ``Keep(UNKNOWN)``, the tee bounds it at max_object as it comes."""
    if status not in (200, 404) or (status == 404 and limits.index_miss_ttl <= 0):
        return DontKeep("status")
    if (refused := _forbidden(headers)) is not None:
        return refused
    length = parse_length(headers.get("Content-Length"))
    if "Content-Length" in headers and length is None:
        return DontKeep("no-length")
    if length is None:
        return Keep(UNKNOWN)
    if status == 200 and length == 0:
        return DontKeep("empty")
    return DontKeep("too-large") if length > limits.max_object else Keep(length)


UNKNOWN = -1  # Keep.length of an answer without Content-Length (a CDX answer, streamed)


def keeps_body(c: Cacheable, status: int, has_text: bool) -> bool:
    """Whether a whole body may be kept: a CDX 200 only with a capture line (pywb answers an empty 200 when
    its backend fails; ``has_text``: a byte other than whitespace came); every other answer, yes."""
    return not (c.rule.cdx and status == 200 and not has_text)


def entry_ttl(limits: CacheLimits, rule: CacheRule, status: int) -> float:
    """An entry's TTL (0: immutable): its rule's, and for a kept "No Captures found" 404, index_miss_ttl."""
    return limits.index_miss_ttl if rule.cdx and status == 404 else rule.ttl


def fresh(rule_ttl: float, stored_at: float, now: float) -> bool:
    """An entry is served while its rule has no TTL, or while its age is within it. A stored time that is
    not finite or lies in the future (a clock stepped back, a damaged header) is stale: refetched."""
    if rule_ttl <= 0:
        return True
    if not math.isfinite(stored_at) or stored_at > now + 60.0:
        return False
    return now - stored_at < rule_ttl


def age_seconds(stored_at: float, now: float) -> int:
    """The ``Age`` header's value: whole seconds since it was stored, never negative or non-finite."""
    if not math.isfinite(stored_at) or not math.isfinite(now) or now <= stored_at:
        return 0
    return int(min(now - stored_at, 2**31 - 1))


def accepts(accept_encoding: str | None, coding: str) -> bool:
    """Whether a client sending ``Accept-Encoding`` takes a body coded ``coding`` (identity always)."""
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return True
    for part in (accept_encoding or "").split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() in (coding, "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


# The headers a hit is answered with (issue 14), besides Age and Via.
STORED_HEADERS = (
    "Content-Type",
    "Content-Length",
    "Content-Range",
    "Content-Encoding",
    "ETag",
    "Last-Modified",
    "Accept-Ranges",
)
