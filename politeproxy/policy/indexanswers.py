"""The index server's answers and warnings (issue 43; policy core, no I/O).

index.commoncrawl.org is one pywb server and the scarcest of Common Crawl's services. Two facts make its
answers worth keeping: a crawl's index never changes once the crawl is published (listed in
``collinfo.json``), and the same CDX question asked again has the same answer. And one fact makes its
warnings worth heeding: it answers 503 first, then drops connections, then blocks. This module says which
crawl a CDX request asks (``crawl_of``), which crawls ``collinfo.json`` lists (``published_crawls``, a
parser of untrusted bytes that never raises), what counts as a warning (``is_warning``) and how long the
service rests after one (``index_rest``). What may be kept, and under which key, stays in cacherules.py.
"""

from __future__ import annotations

import json
import math
import re

CDX_PATH = re.compile(r"/([A-Za-z0-9][A-Za-z0-9_.-]{0,79})-index")  # pywb's /<collection>-index
WARNING_STATUSES = frozenset({502, 503, 504})  # with no answer at all (reset, empty reply): a warning
MAX_COLLINFO = 4 << 20  # bytes of collinfo.json read at most (about 30 KB today)
MAX_CRAWLS = 10_000  # crawls remembered at most (about 120 today)


def crawl_of(path: str) -> str | None:
    """The collection a CDX API path (no query) names: ``/CC-MAIN-2024-33-index`` -> ``CC-MAIN-2024-33``."""
    m = CDX_PATH.fullmatch(path)
    return m.group(1) if m else None


def published_crawls(body: bytes) -> frozenset[str]:
    """The ``id`` of every collection a ``collinfo.json`` body lists; empty when it is not such a list.

    Never raises: the body is the upstream's. Only names a CDX path could carry are taken, at most
    MAX_CRAWLS, so a huge or odd list neither grows a table without bound nor names a path elsewhere."""
    if len(body) > MAX_COLLINFO:
        return frozenset()
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return frozenset()
    if not isinstance(raw, list):
        return frozenset()
    out: set[str] = set()
    for item in raw[:MAX_CRAWLS]:
        cid = item.get("id") if isinstance(item, dict) else None
        if isinstance(cid, str) and crawl_of(f"/{cid}-index") == cid:
            out.add(cid)
    return frozenset(out)


def is_warning(status: int | None) -> bool:
    """An index answer that warns of trouble: 502, 503, 504, or none (a reset or an empty reply)."""
    return status is None or status in WARNING_STATUSES


def index_rest(first: float, retry_after: float | None, backoff: float, warnings: int, cap: float) -> float:
    """How long the index service rests after a warning: the longest of ``first`` doubled per earlier
    warning in a row (``warnings`` counts this one, at least 1), the answer's ``Retry-After`` and today's
    ``backoff``; cut at ``cap`` (never below ``first``). 0 when ``first`` is 0 (the rest is off)."""
    if not (first > 0 and math.isfinite(first)):
        return 0.0
    doubled = first * math.pow(2.0, min(max(warnings, 1) - 1, 64))
    longest = max(doubled, retry_after or 0.0, backoff if math.isfinite(backoff) else 0.0)
    return min(longest, max(cap, first))
