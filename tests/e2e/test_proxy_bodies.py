"""Request and response bodies through the proxy: streamed and sized uploads, chunked both ways,
Expect: 100-continue, HEAD, ranges (206) and gzip passed unchanged. One FAST proxy per module.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
import requests

from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import (
    ProxyFactory,
    arrivals,
    blocks,
    bundle,
    ca_pem,
    exchange,
    metric_value,
    proxies,
    read_head,
    start_with,
    tls_through_proxy,
)
from tests.support.upstream_proc import Certs, Upstream


@pytest.fixture
def fast_proxy(module_fast_proxy: ProxyProc) -> ProxyProc:
    """One FAST proxy for the whole module (these cases only send requests)."""
    return for_this_test(module_fast_proxy)


@pytest.fixture
def upstream(shared_upstream: Upstream) -> Upstream:
    """The module's one fake upstream, reset before each test."""
    return shared_upstream


def test_post_bodies(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    total = 24 * 1024 * 1024 + 123
    want = hashlib.sha256(b"".join(blocks(total))).hexdigest()
    with requests.Session() as s:
        s.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override s.verify
        s.proxies = proxies(fast_proxy)
        s.verify = str(bundle(fast_proxy))
        # A generator body: requests sends it chunked.
        r = s.post("https://commoncrawl.org/echo", data=blocks(total), timeout=60)  # data.* refuses POST
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["method"] == "POST"
        assert body["body_length"] == total
        assert body["sha256"] == want
        # A body with Content-Length: the length reaches the upstream unchanged.
        data = b"".join(blocks(3 * 1024 * 1024 + 7))
        r = s.put("https://commoncrawl.org/echo", data=data, timeout=60)
        body = r.json()
        assert body["method"] == "PUT"
        assert body["sha256"] == hashlib.sha256(data).hexdigest()
        sent_headers = {k.lower(): v for k, v in body["headers"]}
        assert sent_headers.get("content-length") == str(len(data))
        assert "transfer-encoding" not in sent_headers
        # Plain http:// absolute-form POST too.
        r = s.post("http://commoncrawl.org/echo", data=data, timeout=60)
        assert r.json()["sha256"] == hashlib.sha256(data).hexdigest()


def test_chunked_request_body_raw(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    parts = [b"hello ", b"chunked ", b"world" * 1000]
    enc = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    # to the web site: data.commoncrawl.org refuses a POST by its form (issue 42)
    with tls_through_proxy(fast_proxy.port, "commoncrawl.org", ca_pem(fast_proxy)) as s:
        head = b"POST /echo HTTP/1.1\r\nHost: commoncrawl.org\r\nTransfer-Encoding: chunked\r\n\r\n"
        resp = exchange(s, head + enc)
        assert resp.status == 200
        body = json.loads(resp.data)  # type: ignore[attr-defined]
        assert body["body_length"] == sum(map(len, parts))
        assert body["sha256"] == hashlib.sha256(b"".join(parts)).hexdigest()
        # Expect: 100-continue gets its interim answer and the body still arrives.
        data = b"z" * 5000
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: commoncrawl.org\r\nExpect: 100-continue\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
        )
        interim = read_head(s)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        resp = exchange(s, data)
        assert json.loads(resp.data)["sha256"] == hashlib.sha256(data).hexdigest()  # type: ignore[attr-defined]


def test_head(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        resp = exchange(s, b"HEAD /size/123456 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n", "HEAD")
        assert resp.status == 200
        assert resp.getheader("Content-Length") == "123456"
        assert resp.data == b""  # type: ignore[attr-defined]
        # The connection is still in sync: the next answer is the next request's.
        resp = exchange(s, b"GET /size/5 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
        assert resp.data == b"xxxxx"  # type: ignore[attr-defined]
    assert [a["method"] for a in arrivals(upstream, "/size/")] == ["HEAD", "GET"]


def test_range_206(
    proxy_factory: ProxyFactory, files_upstream: Upstream, files_dir: Path, certs: Certs
) -> None:
    data = os.urandom(300_000)
    (files_dir / "part.bin").write_bytes(data)
    p = start_with(proxy_factory, files_upstream, certs)
    with requests.Session() as s:
        s.trust_env = False
        s.proxies = proxies(p)
        s.verify = str(bundle(p))
        for path in ("/files/part.bin", "/cc-index/table/part.bin"):
            r = s.get(f"https://data.commoncrawl.org{path}", headers={"Range": "bytes=1000-1999"}, timeout=30)
            assert r.status_code == 206
            assert r.headers["Content-Range"] == f"bytes 1000-1999/{len(data)}"
            assert r.headers["Content-Length"] == "1000"
            assert r.content == data[1000:2000]
            r = s.get(f"https://data.commoncrawl.org{path}", headers={"Range": "bytes=-10"}, timeout=30)
            assert r.status_code == 206 and r.content == data[-10:]
        r = s.get("https://data.commoncrawl.org/files/part.bin", timeout=30)
        assert r.status_code == 200 and r.content == data
    ranges = [a["range"] for a in arrivals(files_upstream)]
    assert ranges == ["bytes=1000-1999", "bytes=-10", "bytes=1000-1999", "bytes=-10", None]
    # The columnar range read was classified exempt, the rest paced.
    assert metric_value(p, "politeproxy_requests_total", 'class="exempt"') == 2
    assert metric_value(p, "politeproxy_requests_total", 'class="paced"') == 3


def test_chunked_response(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    n = 1_000_003
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        resp = exchange(s, f"GET /size/{n}?chunked=1 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n".encode())
        assert resp.status == 200
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert resp.getheader("Content-Length") is None
        assert resp.data == b"x" * n  # type: ignore[attr-defined]
        resp = exchange(s, b"GET /size/3 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
        assert resp.data == b"xxx"  # type: ignore[attr-defined]


def test_gzip_passes_unchanged(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    want = b"hello gzip " * 100
    for url in ("https://data.commoncrawl.org/gzip", "http://data.commoncrawl.org/gzip"):
        r = requests.get(
            url,
            proxies=proxies(fast_proxy),
            verify=str(bundle(fast_proxy)),
            headers={"Accept-Encoding": "gzip"},
            stream=True,
            timeout=30,
        )
        raw = r.raw.read(decode_content=False)
        assert r.headers["Content-Encoding"] == "gzip"
        assert r.headers["Content-Length"] == str(len(raw))
        assert raw[:2] == b"\x1f\x8b"
        assert gzip.decompress(raw) == want
