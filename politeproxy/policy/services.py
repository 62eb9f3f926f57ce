"""Which Common Crawl service a request is for (policy core, no I/O).

A service is what Common Crawl counts as one: the data distribution (``data.commoncrawl.org``), the index
server (``index.commoncrawl.org``), the web site (``commoncrawl.org``), and the S3 bucket under every name
a tool can use for it: virtual-hosted (``commoncrawl.s3.amazonaws.com``), regional, dualstack, FIPS, the
legacy dash form, and path-style (``s3[.<region>].amazonaws.com/commoncrawl/...``). Every other name
under ``commoncrawl.org`` is one service together (``OTHER_CC``, issue 42, item 10): names are a client's
choice, and each with a window of its own would give each a fresh window and a record (an open file) of its
own. Any other host (one a user added to the paced hosts) is its own service, under its own (normalised)
name. Limits kept per service (the exempt ceiling) are therefore
kept once for the bucket, however many of its names the clients use.
"""

from __future__ import annotations

import functools

from politeproxy.policy.classify import bucket_request
from politeproxy.policy.hosts import (
    BUCKET_HOSTS,
    S3_PATH_STYLE_HOSTS,
    HostSet,
    normalize_host,
    valid_hostname,
)

DATA = "data"
INDEX = "index"
WWW = "www"
BUCKET = "bucket"
OTHER_CC = "other-cc"  # every other name under commoncrawl.org, together
OTHER = "other"  # a name that is no host name: never a key of its own
NAMED: frozenset[str] = frozenset({DATA, INDEX, WWW, BUCKET, OTHER_CC, OTHER})
CC_DOMAIN = "commoncrawl.org"

# The one host name that stands for each named service where a host name is needed (store records,
# metric labels): the ceiling of the bucket lives in the record of its virtual-hosted name.
SERVICE_HOST: dict[str, str] = {
    DATA: "data.commoncrawl.org",
    INDEX: "index.commoncrawl.org",
    WWW: "commoncrawl.org",
    BUCKET: "commoncrawl.s3.amazonaws.com",
    OTHER_CC: "other.commoncrawl.org",
}

_EXACT: dict[str, str] = {h: s for s, h in SERVICE_HOST.items()} | {"www.commoncrawl.org": WWW}
# Every name of the bucket: the default paced patterns that name it (region, dualstack, fips, dash forms).
_BUCKET_NAMES = HostSet(BUCKET_HOSTS)
_PATH_STYLE = HostSet(S3_PATH_STYLE_HOSTS)


@functools.lru_cache(maxsize=4096)  # pure, asked per exempt read; the bound caps client-chosen names
def service_of(host: str, path: str | None = None) -> str:
    """The service of a request to ``host`` (one of ``NAMED``, or a valid host name); never raises.

    ``path`` matters only on S3's own endpoints (path-style): ``/commoncrawl/...`` is the bucket. ``None``
    means the request was already classified as paced, which on those endpoints only the bucket's are.
    """
    h = normalize_host(host)
    if not valid_hostname(h):
        return OTHER
    named = _EXACT.get(h)
    if named is not None:
        return named
    if h.endswith("." + CC_DOMAIN):
        return OTHER_CC
    if _BUCKET_NAMES.matches(h):
        return BUCKET
    if _PATH_STYLE.matches(h) and (path is None or (isinstance(path, str) and bucket_request(h, path))):
        return BUCKET
    return h


def service_key(host: str) -> str:
    """The host name a per-service limit is kept under for a paced ``host`` (its service's own name)."""
    s = service_of(host)
    return SERVICE_HOST.get(s, s)
