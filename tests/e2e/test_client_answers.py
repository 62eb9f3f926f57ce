"""Waits and refusals every client acts on (issue 41): S3's own throttle for the bucket under every name, plain
HTTP fields for the other services, the standard RateLimit, Proxy-Status and Cache-Status fields, and hold
bounds per client.

Every structured field is parsed with http-sf (an RFC 8941/9651 parser, not a pattern of this project's), and
the S3 error body with the standard library's XML parser, as an SDK would read them.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import http_sf
import pytest
import requests

from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import ProxyFactory, bundle, proxies, upstream_toml
from tests.support.upstream_proc import Certs, Upstream

pytestmark = pytest.mark.slow

# Every name of the bucket a tool uses (virtual-hosted, regional, dualstack, the legacy dash form) and
# path-style on S3's own endpoints (intercept_s3_path_style): each URL reaches the bucket.
BUCKET_URLS = (
    "https://commoncrawl.s3.amazonaws.com/crawl-data/x.warc.gz",
    "https://commoncrawl.s3.us-east-1.amazonaws.com/crawl-data/x.warc.gz",
    "https://commoncrawl.s3.dualstack.us-west-2.amazonaws.com/crawl-data/x.warc.gz",
    "https://commoncrawl.s3-us-west-2.amazonaws.com/crawl-data/x.warc.gz",
    "https://s3.amazonaws.com/commoncrawl/crawl-data/x.warc.gz",
    "https://s3.us-east-1.amazonaws.com/commoncrawl/crawl-data/x.warc.gz",
)


def get(p: ProxyProc, url: str, method: str = "GET", **kw: Any) -> requests.Response:
    return requests.request(method, url, proxies=proxies(p), verify=str(bundle(p)), timeout=60, **kw)


def field(r: requests.Response, name: str) -> list[Any]:
    value = r.headers.get(name)
    assert value is not None, (name, dict(r.headers))
    parsed: list[Any] = http_sf.parse(value.encode(), tltype="list")
    return parsed


def proxy_status(r: requests.Response) -> dict[str, Any]:
    [(name, params)] = field(r, "Proxy-Status")
    assert str(name) == "politeproxy"
    return {k: str(v) for k, v in params.items()}


@pytest.fixture(scope="module")
def refusing(
    module_proxy_factory: ProxyFactory, module_upstream: Upstream, certs: Certs
) -> Iterator[ProxyProc]:
    """One paced request a minute, held at most 1 s: after the first, every request is refused at once."""
    text = (
        "intercept_s3_path_style = true\n"
        + NO_ROBOTS
        + '[schedule]\nbackend = "memory"\nglobal_rate = "1/m"\n'
        + '[pacing]\nmax_wait = "1s"\nretries = 0\n[cache]\nenabled = false\n'
        + upstream_toml(module_upstream, certs)
    )
    p = module_proxy_factory(None, text)
    first = get(p, "https://data.commoncrawl.org/echo?first")
    assert first.status_code == 200, first.text
    yield p


@pytest.mark.parametrize("url", BUCKET_URLS)
def test_a_refusal_to_every_bucket_name_is_s3s_slowdown(refusing: ProxyProc, url: str) -> None:
    started = time.monotonic()
    r = get(refusing, url)
    assert time.monotonic() - started < 5.0  # answered at once, not held to a bound
    assert r.status_code == 503
    assert r.headers["Content-Type"] == "application/xml"
    doc = ET.fromstring(r.content)
    assert doc.tag == "Error" and doc.findtext("Code") == "SlowDown"
    assert "politeproxy" in (doc.findtext("Message") or "")
    assert doc.findtext("RequestId") == r.headers["x-amz-request-id"]
    ms = int(r.headers["x-amz-retry-after"])
    assert 0 < ms <= 5000  # botocore honours it up to its own backoff + 5 s
    assert int(r.headers["Retry-After"]) == math.ceil(ms / 1000)
    assert proxy_status(r)["error"] == "http_request_denied"


def test_a_head_refusal_to_the_bucket_has_no_body_but_its_retry_after(refusing: ProxyProc) -> None:
    r = get(refusing, BUCKET_URLS[0], "HEAD")
    assert r.status_code == 503 and r.content == b""
    assert 0 < int(r.headers["x-amz-retry-after"]) <= 5000 and "Retry-After" in r.headers


def test_refused_bucket_requests_are_told_to_come_back_apart(refusing: ProxyProc) -> None:
    """Staggered: refusals of one service don't all come back at the same moment."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: get(refusing, BUCKET_URLS[0]), range(16)))
    times = [int(r.headers["x-amz-retry-after"]) for r in answers]
    assert all(r.status_code == 503 for r in answers)
    assert len(set(times)) >= 12, times  # distinct return times (one slot apart unless folded into the cap)


@pytest.mark.parametrize("host", ["data.commoncrawl.org", "index.commoncrawl.org"])
def test_a_refusal_elsewhere_is_a_plain_503_with_retry_after_and_proxy_status(
    refusing: ProxyProc, host: str
) -> None:
    r = get(refusing, f"https://{host}/echo?refused")
    assert r.status_code == 503
    assert r.headers["Content-Type"].startswith("text/plain") and "x-amz-retry-after" not in r.headers
    assert int(r.headers["Retry-After"]) >= 1
    ps = proxy_status(r)
    assert ps["error"] == "http_request_denied" and host in ps["details"]
    [(name, params)] = field(r, "RateLimit-Policy")
    assert name == "window" and params["q"] == 4800 and params["w"] == 300


@pytest.fixture(scope="module")
def windowed(module_proxy_factory: ProxyFactory, module_upstream: Upstream, certs: Certs) -> ProxyProc:
    """Pacing off, a window of 500 requests per 120 s: every answer says what is left of it."""
    text = (
        NO_ROBOTS
        + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n[egress]\nwindow = "120s"\nlimit = 500\n'
        + upstream_toml(module_upstream, certs)
    )
    return module_proxy_factory(None, text)


def window_used(p: ProxyProc, service: str) -> int:
    doc = requests.get(p.url + "/status", timeout=10).json()
    [w] = [w for w in doc["windows"] if w["service"] == service]
    used: int = w["requests"]
    return used


def test_every_paced_answer_tells_the_window_left_as_status_does(windowed: ProxyProc) -> None:
    host = "data.commoncrawl.org"
    for i in range(120):
        r = get(windowed, f"https://{host}/echo?n={i}")
        assert r.status_code == 200
        [(name, policy)] = field(r, "RateLimit-Policy")
        [(name2, left)] = field(r, "RateLimit")
        assert name == name2 == "window" and policy == {"q": 500, "w": 120}
        assert 0 <= left["r"] <= 500 and 0 <= left["t"] <= 120
    time.sleep(0.5)  # the proxy reads the window at most every 0.25 s: this answer's reading is fresh
    r = get(windowed, f"https://{host}/echo?last")
    [(_, left)] = field(r, "RateLimit")
    status_left = 500 - window_used(windowed, host)
    # within 1 % of the window: the answer's reading may be one refresh (0.25 s) older than /status's
    assert abs(left["r"] - status_left) <= 5, (left, status_left)
    assert status_left <= 500 - 121


def test_a_cache_hit_says_so_in_cache_status(windowed: ProxyProc) -> None:
    url = "https://data.commoncrawl.org/crawl-data/CC-MAIN-2024-10/segments/x/warc/answers.warc.gz"
    first = get(windowed, url)
    [(name, params)] = field(first, "Cache-Status")
    assert str(name) == "politeproxy" and str(params["fwd"]) == "miss"
    second = get(windowed, url)
    assert second.status_code == first.status_code == 200 and second.content == first.content
    [(name, params)] = field(second, "Cache-Status")
    assert str(name) == "politeproxy" and params == {"hit": True}
    field(second, "RateLimit-Policy")  # a hit is an answer for a Common Crawl service too
