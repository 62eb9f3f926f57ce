"""Sort a request into paced, exempt or passthrough (policy core, no I/O)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import unquote

from politeproxy.policy.hosts import BUCKET_HOSTS, S3_PATH_STYLE_HOSTS, HostSet, host_matches

BUCKET = "commoncrawl"  # the S3 bucket whose path-style requests are paced
_PATH_STYLE = HostSet(S3_PATH_STYLE_HOSTS)


def normalize_path(path: str) -> str:
    """The path a server resolves: query dropped, percent-decoded, dot segments removed.

    Matching the raw path would let ``/cc-index/table/../../crawl-data/...`` skip the schedule, since the
    upstream (or any CDN in front of it) resolves the dot segments (RFC 3986, 5.2.4) before serving it.
    """
    path = unquote(path.split("?", 1)[0])
    if "." not in path:
        return path
    segs = path.lstrip("/").split("/")
    out: list[str] = []
    for seg in segs:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segs[-1] in (".", ".."):
        out.append("")  # "/a/b/.." is the directory "/a/"
    return "/" + "/".join(out)


class Klass(StrEnum):
    PACED = "paced"
    EXEMPT = "exempt"
    PASSTHROUGH = "passthrough"


@dataclass(frozen=True)
class ExemptRule:
    """Requests matching every field skip the global schedule (columnar range reads by default)."""

    host: str = "data.commoncrawl.org"
    path: str = "/cc-index/table/"
    range_required: bool = True
    methods: tuple[str, ...] = ("GET", "HEAD")

    def matches(self, method: str, host: str, path: str, has_range: bool) -> bool:
        return host_matches(host, self.host) and self.fits(method.upper(), path, has_range)

    def fits(self, method: str, path: str, has_range: bool) -> bool:
        """``matches`` for a host already known to match, ``method`` in upper case."""
        if method not in self.methods:
            return False
        # A HEAD carries no body, so it is a size probe like "Range: bytes=0-0": duckdb and fsspec open a
        # parquet file with a HEAD, and a scan of N files must not wait N paced slots before its reads.
        if self.range_required and not has_range and method != "HEAD":
            return False
        path = normalize_path(path)
        if any(c in self.path for c in "*?["):
            return fnmatch.fnmatchcase(path, self.path)
        return path.startswith(self.path)


# Common Crawl's published parquet datasets: the columnar index and the host index (its "-testing/v2"
# and the names that succeed it). Immutable once published, read in ranges by duckdb, pyarrow, fsspec.
PARQUET_PATHS: tuple[str, ...] = ("/cc-index/table/", "/projects/host-index*")
# The services whose range reads are exempt: the data distribution and the bucket under each of its names.
# Not index.commoncrawl.org (one pywb server with per-IP limits: it keeps its interval for every request),
# nor commoncrawl.org.
EXEMPT_HOSTS: tuple[str, ...] = ("data.commoncrawl.org", *BUCKET_HOSTS)
DEFAULT_EXEMPT_RULES: tuple[ExemptRule, ...] = tuple(
    ExemptRule(host=h, path=p) for h in EXEMPT_HOSTS for p in PARQUET_PATHS
)


MAX_HOSTS_REMEMBERED = 256  # hosts whose rules are remembered (client-chosen names: cleared when full)


@dataclass
class Classifier:
    hosts: HostSet
    rules: tuple[ExemptRule, ...] = field(default=DEFAULT_EXEMPT_RULES)
    # The rules whose host matches, per host: classify runs on every request, and matching a host against
    # each of the 16 default rules normalises both names each time. Built for ``_built_for`` only.
    _by_host: dict[str, tuple[ExemptRule, ...]] = field(default_factory=dict, init=False, repr=False)
    _built_for: tuple[ExemptRule, ...] = field(default=(), init=False, repr=False)

    def reload(self, rules: tuple[ExemptRule, ...]) -> None:
        """Apply [[exempt.rules]] from a reloaded config; the next request is classified by them."""
        self.rules = rules

    def rules_for(self, host: str) -> tuple[ExemptRule, ...]:
        """The rules whose host matches ``host``, remembered while ``rules`` stays the same object."""
        if self._built_for is not self.rules:
            self._by_host.clear()
            self._built_for = self.rules
        found = self._by_host.get(host)
        if found is None:
            if len(self._by_host) >= MAX_HOSTS_REMEMBERED:
                self._by_host.clear()
            found = self._by_host[host] = tuple(r for r in self.rules if host_matches(host, r.host))
        return found

    def classify(self, method: str, host: str, path: str, has_range: bool) -> Klass:
        if not self.hosts.matches(host):
            return Klass.PASSTHROUGH
        if _PATH_STYLE.matches(host):  # intercepted only with intercept_s3_path_style (or listed by hand)
            as_bucket = bucket_request(host, path)
            if as_bucket is None:
                return Klass.PASSTHROUGH  # another bucket: relayed as it came, never paced
            host, path = as_bucket
        upper = method.upper()
        for r in self.rules_for(host):  # a loop, not any(genexpr): classify runs on every request
            if r.fits(upper, path, has_range):
                return Klass.EXEMPT
        return Klass.PACED


def bucket_request(host: str, path: str) -> tuple[str, str] | None:
    """A path-style S3 request (``s3[.region].amazonaws.com/commoncrawl/key``) as the bucket's own
    virtual-hosted request (``commoncrawl.s3[.region].amazonaws.com/key``); None for any other bucket.

    The path is the one S3 resolves (``normalize_path``: ``/x/../commoncrawl/`` and ``/common%63rawl/``
    are the bucket too), and leading slashes are skipped: anything that may reach the bucket is paced.
    """
    rest = normalize_path(path).lstrip("/")
    name, sep, key = rest.partition("/")
    if name != BUCKET:
        return None
    return f"{BUCKET}.{host}", "/" + key
