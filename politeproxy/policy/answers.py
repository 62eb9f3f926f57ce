"""What the proxy says in its own answers, in the terms each client's retry logic reads (policy core, no I/O).

A refusal only helps a pipeline if its client reads it as meant (issue 41). AWS SDKs decide "throttled" by
the S3 error code in the body, not by the status: a bare 503 is a transient error (a 50 ms retry that costs
14 of the client's 500 retry tokens), ``SlowDown`` a throttle (a 1 s base backoff, 5 tokens, the adaptive
mode's rate limiter engaged, and ``x-amz-retry-after`` honoured). So an answer the proxy makes to a request
for the bucket is S3's own XML error; every other service gets plain HTTP fields.

The fields, each written to its specification as a structured field (RFC 8941 / RFC 9651):

- ``Proxy-Status`` (RFC 9209): ``politeproxy; error=http_request_denied; details="..."``;
- ``Cache-Status`` (RFC 9211): ``politeproxy; hit`` or ``politeproxy; fwd=miss; stored``;
- ``RateLimit-Policy`` and ``RateLimit`` (IETF httpapi ratelimit-headers draft, -08 and later):
  ``"window";q=4800;w=300`` and ``"window";r=4123;t=57``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from xml.sax.saxutils import escape

PROXY_NAME = "politeproxy"  # the sf-token this proxy names itself by in Proxy-Status and Cache-Status
POLICY_NAME = "window"  # the RateLimit policy's name (an sf-string)
MAX_DETAILS = 300  # characters of a Proxy-Status details string, or an S3 message
RETRY_AFTER_CAP_MS = 5000  # botocore honours x-amz-retry-after up to its own backoff + 5 s, not beyond

# RFC 9209's registry, the types this proxy uses, by what the proxy knows of the cause.
DENIED = "http_request_denied"  # a pacing, window, queue or block refusal; an auth refusal
REQUEST_ERROR = "http_request_error"  # a request of a form the proxy or the service refuses
POOL_FULL = "connection_limit_reached"
TLS_ERROR = "tls_certificate_error"
DNS_ERROR = "dns_error"
REFUSED = "connection_refused"
TIMEOUT = "connection_timeout"
UNAVAILABLE = "destination_unavailable"
INTERNAL = "proxy_internal_error"

_BY_STATUS = {
    400: REQUEST_ERROR,
    403: DENIED,
    405: REQUEST_ERROR,
    407: DENIED,
    411: REQUEST_ERROR,
    413: REQUEST_ERROR,
    421: REQUEST_ERROR,
    431: REQUEST_ERROR,
    500: INTERNAL,
    502: UNAVAILABLE,
    503: DENIED,
    504: TIMEOUT,
}
_BY_LOCAL = {"tls": TLS_ERROR, "dns": DNS_ERROR, "refused": REFUSED}

# S3's error codes for what the proxy answers itself, by status: what an AWS SDK reads.
_S3_CODES = {
    400: "InvalidRequest",
    403: "AccessDenied",
    405: "MethodNotAllowed",
    411: "MissingContentLength",
    413: "EntityTooLarge",
    421: "InvalidRequest",
    431: "InvalidRequest",
    500: "InternalError",
    503: "SlowDown",
}


def error_type(status: int, local: str = "") -> str:
    """The Proxy-Status error type of the proxy's own answer with ``status`` (``local``: the upstream
    client's local cause, "tls", "dns" or "refused")."""
    return _BY_LOCAL.get(local) or _BY_STATUS.get(status, INTERNAL if status >= 500 else REQUEST_ERROR)


def sf_string(text: str, limit: int = MAX_DETAILS) -> str:
    """``text`` as an RFC 8941 sf-string: quoted, printable ASCII only (anything else becomes ``?``), ``\\``
    and ``"`` escaped, cut to ``limit`` characters. Never raises."""
    out = []
    for ch in str(text)[:limit]:
        if ch in '\\"':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append("?")
    return '"' + "".join(out) + '"'


def proxy_status(error: str, details: str = "") -> str:
    """The Proxy-Status field of an answer this proxy made itself."""
    field = f"{PROXY_NAME}; error={error}"
    return f"{field}; details={sf_string(details)}" if details else field


# RFC 9211's fwd reasons this proxy has, by the cache result the exchange recorded
_FWD = {"miss": "miss", "stale": "stale", "bypass": "bypass", "refresh": "request"}


def cache_status(result: str, stored: bool = False) -> str:
    """The Cache-Status field for a cache ``result`` ("hit", "miss", "stale", "bypass", "refresh");
    ``stored``: the forwarded answer is being kept."""
    if result == "hit":
        return f"{PROXY_NAME}; hit"
    field = f"{PROXY_NAME}; fwd={_FWD.get(result, 'miss')}"
    return f"{field}; stored" if stored else field


_POLICY = sf_string(POLICY_NAME)  # a constant: quoted once, not twice per answer


@dataclass(frozen=True, slots=True)
class Quota:
    """One service's quota as a client is told it: ``limit`` requests per ``window`` seconds, ``remaining``
    of them now, all restored within ``reset`` seconds."""

    limit: int
    window: float
    remaining: int
    reset: float

    def policy_field(self) -> str:
        return _policy_text(max(0, self.limit), _whole(self.window))

    def field(self) -> str:
        return _field_text(min(max(0, self.remaining), max(0, self.limit)), _whole(self.reset))


# Both fields are made for every paced answer, from a few distinct numbers: each text is made once.
@lru_cache(maxsize=256)
def _policy_text(limit: int, window: int) -> str:
    return f"{_POLICY};q={limit};w={window}"


@lru_cache(maxsize=1024)
def _field_text(remaining: int, reset: int) -> str:
    return f"{_POLICY};r={remaining};t={reset}"


def _whole(seconds: float) -> int:
    """Whole seconds, rounded up (a client must not come back early); non-finite or negative reads 0."""
    if not math.isfinite(seconds) or seconds <= 0:
        return 0
    return min(10**9, math.ceil(seconds - 1e-9))


@lru_cache(maxsize=256)  # one per count a service's window goes through: asked again by every answer
def window_quota(limit: int, window: float, used: int) -> Quota:
    """The request window as a quota: what it holds now is spent, and all of it has left within a window."""
    used = max(0, used)
    return Quota(limit, window, limit - used, window if used else 0.0)


def rate_quota(interval: float, wait: float) -> Quota:
    """With the window off: the service's paced rate as a one-second quota (at least 1). ``wait``: how long
    a request asked now would wait; when it waits, nothing is left of this second."""
    return _rate_open(interval) if wait <= 0 else _rate_quota(interval, wait)


@lru_cache(maxsize=64)  # a service with nothing queued: the same quota for every answer (one per interval)
def _rate_open(interval: float) -> Quota:
    return _rate_quota(interval, 0.0)


def _rate_quota(interval: float, wait: float) -> Quota:
    per_second = 1 if interval <= 0 or not math.isfinite(interval) else max(1, math.floor(1.0 / interval))
    if interval <= 0:
        return Quota(per_second, 1.0, per_second, 0.0)
    return Quota(per_second, 1.0, 0 if wait > 0 else per_second, wait if wait > 0 else 0.0)


def s3_error(code: str, message: str, request_id: str, resource: str = "") -> bytes:
    """S3's error document (``<Error><Code>..``), as an SDK parses it; every value XML-escaped."""
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error>',
        f"<Code>{escape(code)}</Code>",
        f"<Message>{escape(_printable(message))}</Message>",
    ]
    if resource:
        parts.append(f"<Resource>{escape(_printable(resource))}</Resource>")
    parts.append(f"<RequestId>{escape(request_id)}</RequestId></Error>\n")
    return "".join(parts).encode()


def s3_code(status: int) -> str:
    return _S3_CODES.get(status, "InternalError" if status >= 500 else "InvalidRequest")


def _printable(text: str) -> str:
    """XML 1.0 allows no C0 controls but tab, LF, CR: anything unprintable becomes ``?``."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(text)[:MAX_DETAILS])


class Stagger:
    """When each refused request of a service should come back, so that refusals don't return together.

    A refusal's own turn would fall inside its bound after ``wait - bound`` seconds; refusals of one
    service are spread ``spacing`` apart from there (one slot each). A time past ``cap`` is folded into the
    second half of the cap, ``FOLDS`` distinct times in turn: such a request will be refused again anyway,
    and must not come back in a herd. Pure: the caller passes the clock. At most ``max_keys`` services are
    remembered."""

    FOLDS = 32

    def __init__(self, cap: float = RETRY_AFTER_CAP_MS / 1000, max_keys: int = 64) -> None:
        self.cap = cap
        self.max_keys = max_keys
        self._next: dict[str, float] = {}
        self._folded = 0

    def advise(self, key: str, now: float, wait: float, bound: float, spacing: float) -> float:
        """Seconds until this refused request should be asked again (0 < result <= cap)."""
        if not math.isfinite(wait) or wait < 0:
            wait = 0.0
        if not math.isfinite(bound) or bound < 0:
            bound = 0.0
        spacing = min(spacing, self.cap) if math.isfinite(spacing) and spacing > 0 else 0.01
        target = now + max(0.0, wait - bound)
        at = max(target, self._next.get(key, 0.0))
        self._next.pop(key, None)
        self._next[key] = min(at + spacing, now + 2 * self.cap)  # a cursor never runs far ahead
        while len(self._next) > self.max_keys:
            del self._next[next(iter(self._next))]
        after = at - now
        if after > self.cap:
            self._folded = (self._folded + 1) % self.FOLDS
            after = self.cap - (self.cap / 2) * self._folded / self.FOLDS
        return min(self.cap, max(0.001, after))
