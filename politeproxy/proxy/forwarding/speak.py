"""The proxy's answers in the terms each client's retry logic reads (issue 41).

- A refusal, or any answer the proxy makes itself, to a request for the bucket (under every name it has,
  path-style included) is S3's own XML error: ``SlowDown`` for "not now", with ``x-amz-retry-after``
  (milliseconds, staggered per request, at most 5 s) and ``Retry-After`` (seconds); ``MethodNotAllowed`` for a
  method the bucket refuses; an AWS SDK reads it as S3 throttling it. Other services keep a plain 503 with
  ``Retry-After``.
- Every answer the proxy makes itself says so in ``Proxy-Status`` (``Own.head``); every answer to a request
  for a Common Crawl service carries ``RateLimit-Policy`` and ``RateLimit``; every answer the cache could
  serve carries ``Cache-Status``.
"""

from __future__ import annotations

import math
import secrets

from multidict import CIMultiDict

from politeproxy.policy.answers import RETRY_AFTER_CAP_MS, Stagger, cache_status, s3_code, s3_error
from politeproxy.policy.backoff import retry_after_seconds
from politeproxy.policy.services import BUCKET, service_of
from politeproxy.proxy.common.clientside import Own
from politeproxy.proxy.common.exchange import Exchange

XML = "application/xml"
AMZ_RETRY_AFTER = "x-amz-retry-after"


class Speaker:
    """One per proxy process: the bucket's refusals are staggered across every client of the process."""

    def __init__(self) -> None:
        self.stagger = Stagger()

    def refusal(
        self, ex: Exchange, path: str, message: str, wait: float, bound: float, gap: float, now: float
    ) -> Own:
        """A 503 for a request the pacer would hold past its ``bound`` (its wait: ``wait``)."""
        out = Own(503, message, CIMultiDict(), error="http_request_denied")
        if is_bucket(ex.host, path):
            after = self.stagger.advise("bucket", now, wait, bound, gap)
            out.headers[AMZ_RETRY_AFTER] = str(max(1, math.ceil(after * 1000)))
            out.headers["Retry-After"] = str(max(1, math.ceil(after)))
        else:
            out.headers["Retry-After"] = str(retry_after_seconds(wait))
        return out


def is_bucket(host: str, path: str) -> bool:
    return service_of(host, path) == BUCKET


def dialect(out: Own, ex: Exchange, path: str) -> Own:
    """The proxy's own answer as the client reads it: S3's XML error for the bucket's names."""
    if not is_bucket(ex.host, path) or out.payload is not None:
        return out
    request_id = secrets.token_hex(8).upper()
    code = s3_code(out.status)
    out.payload = s3_error(code, f"politeproxy: {out.message}", request_id, path.split("?", 1)[0])
    out.content_type = XML
    out.headers["x-amz-request-id"] = request_id
    if out.status == 503 and AMZ_RETRY_AFTER not in out.headers:
        seconds = min(_float(out.headers.get("Retry-After")), RETRY_AFTER_CAP_MS / 1000)
        out.headers[AMZ_RETRY_AFTER] = str(max(1, math.ceil(seconds * 1000)))
    return out


def _float(v: str | None) -> float:
    try:
        f = float(v) if v is not None else 1.0
    except ValueError:
        return 1.0
    return f if math.isfinite(f) and f > 0 else 1.0


def standard_fields(headers: CIMultiDict[str], ex: Exchange, stored: bool = False) -> None:
    """RateLimit-Policy and RateLimit (the service's quota, when the pacer gave one) and Cache-Status (when
    the cache was asked); ``stored``: the cache keeps this forwarded answer."""
    q = ex.quota
    if q is not None:
        headers["RateLimit-Policy"] = q.policy_field()
        headers["RateLimit"] = q.field()
    if ex.cache is not None:
        headers["Cache-Status"] = cache_status(ex.cache, stored)
