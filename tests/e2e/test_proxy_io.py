"""Proxy I/O end to end: real sockets on 127.0.0.1, a real proxy process, the fake TLS upstream.

Also holds the small helpers the other end-to-end test files share (they import them from here).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import (
    NO_ROBOTS,
    Certs,
    ProxyProc,
    Upstream,
    need_tool,
    resolve_table,
    start_upstream,
    wait_for,
)

# Pacing is the next layer's business: these tests run it off (memory store, no global gap).
FAST = NO_ROBOTS + '[schedule]\nbackend = "memory"\nglobal_rate = "0"\n'

ProxyFactory = Callable[..., ProxyProc]


def upstream_toml(up: Upstream, certs: Certs, resolve: dict[str, str] | None = None, **settings: str) -> str:
    """An ``[upstream]`` section like conftest's, plus extra keys (values are TOML literals).

    ``resolve`` replaces or adds entries of the resolve table (``"host:port": "ip:port"``).
    """
    extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
    table = dict(line.split(" = ", 1) for line in resolve_table(up).splitlines())
    table.update({f'"{k}"': f'"{v}"' for k, v in (resolve or {}).items()})
    lines = "\n".join(f"{k} = {v}" for k, v in table.items())
    return f'[upstream]\nca_file = "{certs.ca_file}"\n{extra}[upstream.resolve]\n{lines}\n'


def start_with(
    factory: ProxyFactory,
    up: Upstream,
    certs: Certs,
    extra: str = "",
    resolve: dict[str, str] | None = None,
    top: str = "",
    up_settings: dict[str, str] | None = None,
    **factory_kw: Any,
) -> ProxyProc:
    """A proxy whose config is ``top`` + FAST + ``extra`` + an [upstream] section with ``up_settings``."""
    text = top + FAST + extra + "\n" + upstream_toml(up, certs, resolve, **(up_settings or {}))
    return factory(None, text, **factory_kw)


@pytest.fixture
def fast_proxy(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> ProxyProc:
    return start_with(proxy_factory, upstream, certs)


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    d = tmp_path / "files"
    d.mkdir()
    return d


@pytest.fixture
def files_upstream(certs: Certs, tmp_path: Path, files_dir: Path) -> Iterator[Upstream]:
    up = start_upstream(certs, tmp_path, files_dir=files_dir)
    yield up
    up.stop()


def read_head(sock: socket.socket) -> bytes:
    """Read an HTTP response head byte by byte (so nothing after it is consumed)."""
    buf = b""
    while not buf.endswith(b"\r\n\r\n"):
        b = sock.recv(1)
        if not b:
            break
        buf += b
    return buf


def connect_tunnel(port: int, target: str, extra_headers: str = "") -> tuple[socket.socket, bytes]:
    """A raw socket to the proxy after ``CONNECT target``; returns it and the proxy's answer head."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra_headers}\r\n".encode())
    return s, read_head(s)


def tls_through_proxy(port: int, host: str, cafile: Path | str) -> ssl.SSLSocket:
    """A TLS connection to ``host:443`` through the proxy, verified against ``cafile`` only."""
    s, head = connect_tunnel(port, f"{host}:443")
    assert head.startswith(b"HTTP/1.1 200"), head
    ctx = ssl.create_default_context(cafile=str(cafile))
    return ctx.wrap_socket(s, server_hostname=host)


def exchange(sock: socket.socket, request: bytes, method: str = "GET") -> http.client.HTTPResponse:
    """Send one raw request on ``sock`` and read the whole response (body in ``resp.data``)."""
    sock.sendall(request)
    resp = http.client.HTTPResponse(sock, method=method)  # type: ignore[arg-type]
    resp.begin()
    resp.data = resp.read()  # type: ignore[attr-defined]
    return resp


class _NoClose:
    """A buffered reader that http.client cannot close, so pipelined answers share one buffer."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def close(self) -> None:
        pass


def read_pipelined(sock: socket.socket, n: int) -> list[bytes]:
    """Read ``n`` answers sent back to back on ``sock``; return their bodies."""
    f = _NoClose(sock.makefile("rb"))
    out = []
    for _ in range(n):
        resp = http.client.HTTPResponse(sock, method="GET")  # type: ignore[arg-type]
        resp.fp = f  # type: ignore[assignment]
        resp.begin()
        out.append(resp.read())
    return out


def ca_pem(p: ProxyProc) -> Path:
    return p.data_dir / "ca.pem"


def bundle(p: ProxyProc) -> Path:
    return p.data_dir / "ca-bundle.pem"


def proxies(p: ProxyProc) -> dict[str, str]:
    return {"http": p.url, "https": p.url}


def arrivals(up: Upstream, path_prefix: str = "") -> list[dict[str, Any]]:
    return [a for a in up.log() if a["path"].startswith(path_prefix)]


def still_serves(p: ProxyProc, up: Upstream | None = None) -> None:
    """A normal intercepted request succeeds (after each bad input)."""
    r = requests.get(
        "https://data.commoncrawl.org/echo?still=1", proxies=proxies(p), verify=str(bundle(p)), timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/echo?still=1"


def metric_value(p: ProxyProc, name: str, labels: str = "") -> float:
    """The value of one sample of /metrics, 0 when absent (``labels`` like 'reason="auth"')."""
    total = 0.0
    for line in p.metrics().splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{", 1)[0] == name and all(part in key for part in labels.split(",") if part):
            total += float(value)
    return total


def proc_mem_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS"):
            out[k] = int(v.split()[0])
    return out


# -- intercepted, tunnelled, plain -----------------------------------------------------------------


def test_intercepted_leaf_is_from_the_proxy_ca(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        cert = s.getpeercert()
        assert cert is not None
        issuer = dict(x[0] for x in cert["issuer"])
        assert issuer["organizationName"] == "politeproxy"
        assert ("DNS", "data.commoncrawl.org") in cert["subjectAltName"]
        resp = exchange(s, b"GET /echo?i=1 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
        assert resp.status == 200
        body = json.loads(resp.data)  # type: ignore[attr-defined]
        assert body["host"] == "data.commoncrawl.org"
    assert [a["host"] for a in arrivals(upstream, "/echo")] == ["data.commoncrawl.org"]


def test_tunnel_shows_the_upstreams_own_certificate(
    fast_proxy: ProxyProc, upstream: Upstream, certs: Certs
) -> None:
    with tls_through_proxy(fast_proxy.port, "other.example", certs.ca_file) as s:
        cert = s.getpeercert()
        assert cert is not None
        issuer = dict(x[0] for x in cert["issuer"])
        assert issuer.get("organizationName") != "politeproxy"
        resp = exchange(s, b"GET /hello HTTP/1.1\r\nHost: other.example\r\n\r\n")
        assert resp.status == 200
        assert resp.data == b"hello from other.example/hello\n"  # type: ignore[attr-defined]
    # The proxy's CA does not vouch for other.example: it never made a leaf for it.
    s, head = connect_tunnel(fast_proxy.port, "other.example:443")
    assert head.startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=str(ca_pem(fast_proxy)))
    with pytest.raises(ssl.SSLCertVerificationError), ctx.wrap_socket(s, server_hostname="other.example"):
        pass
    s.close()


def test_plain_http_absolute_form(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    for host in ("data.commoncrawl.org", "other.example"):
        r = requests.get(f"http://{host}/echo?plain=1", proxies=proxies(fast_proxy), timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["path"] == "/echo?plain=1"
        assert body["host"] == host  # the upstream sees the origin's Host, not the proxy's
        headers = {k.lower() for k, _ in body["headers"]}
        assert "proxy-connection" not in headers and "proxy-authorization" not in headers
    got = [(a["host"], a["path"]) for a in arrivals(upstream, "/echo")]
    assert got == [("data.commoncrawl.org", "/echo?plain=1"), ("other.example", "/echo?plain=1")]


def test_many_requests_over_one_intercepted_connection(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    ctx = ssl.create_default_context(cafile=str(ca_pem(fast_proxy)))
    conn = http.client.HTTPSConnection("127.0.0.1", fast_proxy.port, context=ctx, timeout=30)
    conn.set_tunnel("data.commoncrawl.org", 443)
    n = 25
    sock = None
    try:
        for i in range(n):
            conn.request("GET", f"/size/{1000 + i}")
            r = conn.getresponse()
            assert r.status == 200
            assert r.read() == b"x" * (1000 + i)
            if sock is None:
                sock = conn.sock
            assert conn.sock is sock, "the client had to reconnect"
        # One tunnel is open at the proxy, and it served all N requests.
        assert metric_value(fast_proxy, "politeproxy_tunnels_open") == 1
    finally:
        conn.close()
    assert len(arrivals(upstream, "/size/")) == n
    wait_for(lambda: metric_value(fast_proxy, "politeproxy_tunnels_open") == 0, 20, "tunnel closed")


def test_requests_session_reuses_one_tunnel(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    with requests.Session() as s:
        s.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override s.verify
        s.proxies = proxies(fast_proxy)
        s.verify = str(bundle(fast_proxy))
        for i in range(10):
            r = s.get(f"https://data.commoncrawl.org/echo?n={i}", timeout=30)
            assert r.status_code == 200
        assert metric_value(fast_proxy, "politeproxy_tunnels_open") == 1
    assert len(arrivals(upstream, "/echo")) == 10


# -- bodies ----------------------------------------------------------------------------------------


def _blocks(total: int, block: int = 1 << 16) -> Iterator[bytes]:
    pattern = hashlib.sha256(b"seed").digest() * (block // 32)
    sent = 0
    while sent < total:
        chunk = pattern[: min(block, total - sent)]
        sent += len(chunk)
        yield chunk


def test_post_bodies(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    total = 24 * 1024 * 1024 + 123
    want = hashlib.sha256(b"".join(_blocks(total))).hexdigest()
    with requests.Session() as s:
        s.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override s.verify
        s.proxies = proxies(fast_proxy)
        s.verify = str(bundle(fast_proxy))
        # A generator body: requests sends it chunked.
        r = s.post("https://data.commoncrawl.org/echo", data=_blocks(total), timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["method"] == "POST"
        assert body["body_length"] == total
        assert body["sha256"] == want
        # A body with Content-Length: the length reaches the upstream unchanged.
        data = b"".join(_blocks(3 * 1024 * 1024 + 7))
        r = s.put("https://data.commoncrawl.org/echo", data=data, timeout=60)
        body = r.json()
        assert body["method"] == "PUT"
        assert body["sha256"] == hashlib.sha256(data).hexdigest()
        sent_headers = {k.lower(): v for k, v in body["headers"]}
        assert sent_headers.get("content-length") == str(len(data))
        assert "transfer-encoding" not in sent_headers
        # Plain http:// absolute-form POST too.
        r = s.post("http://data.commoncrawl.org/echo", data=data, timeout=60)
        assert r.json()["sha256"] == hashlib.sha256(data).hexdigest()


def test_chunked_request_body_raw(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    parts = [b"hello ", b"chunked ", b"world" * 1000]
    enc = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        head = b"POST /echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\nTransfer-Encoding: chunked\r\n\r\n"
        resp = exchange(s, head + enc)
        assert resp.status == 200
        body = json.loads(resp.data)  # type: ignore[attr-defined]
        assert body["body_length"] == sum(map(len, parts))
        assert body["sha256"] == hashlib.sha256(b"".join(parts)).hexdigest()
        # Expect: 100-continue gets its interim answer and the body still arrives.
        data = b"z" * 5000
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\nExpect: 100-continue\r\n"
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


def test_256mib_body_streams_in_bounded_memory(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    curl = need_tool("curl")
    size = 256 * 1024 * 1024
    pid = fast_proxy.proc.pid
    env = fast_proxy.env

    def fetch(n: int) -> str:
        r = subprocess.run(
            [curl, "-sS", "--max-time", "240", "-o", "/dev/null", "-w", "%{http_code} %{size_download}"]
            + [f"https://data.commoncrawl.org/size/{n}"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert fetch(4 * 1024 * 1024) == f"200 {4 * 1024 * 1024}"  # warm up: leaf, pool, buffers
    before = proc_mem_kib(pid)
    assert fetch(size) == f"200 {size}"
    after = proc_mem_kib(pid)
    grew = (after["VmHWM"] - before["VmHWM"]) / 1024
    assert grew < 64, f"peak RSS grew by {grew:.1f} MiB streaming 256 MiB (before {before}, after {after})"
    assert metric_value(fast_proxy, "politeproxy_bytes_total", 'direction="upstream_to_client"') >= size


# -- the 421 cross-host refusal ---------------------------------------------------------------------


def test_421_cross_host_inside_tunnel(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        for host in ("other.example", "index.commoncrawl.org", "data.commoncrawl.org:8443"):
            resp = exchange(s, f"GET /echo?evil=1 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert resp.status == 421, (host, resp.data)  # type: ignore[attr-defined]
            assert b"data.commoncrawl.org" in resp.data  # type: ignore[attr-defined]
        # An absolute-form target naming another host inside the tunnel is refused too.
        resp = exchange(
            s, b"GET https://other.example/echo?evil=2 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n"
        )
        assert resp.status == 421
        # The tunnel still serves its own host (HTTP/1.0 without Host means the CONNECT target).
        resp = exchange(s, b"GET /echo?ok=0 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert resp.status == 200
        resp = exchange(s, b"GET /echo?ok=1 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
        assert resp.status == 200
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        # HTTP/1.1 without Host is malformed (RFC 9112 3.2): refused, never forwarded.
        resp = exchange(s, b"GET /echo?nohost=1 HTTP/1.1\r\n\r\n")
        assert resp.status == 400
    assert [a["path"] for a in arrivals(upstream, "/echo")] == ["/echo?ok=0", "/echo?ok=1"]
    assert metric_value(fast_proxy, "politeproxy_rejected_total", 'reason="misdirected"') == 4


@pytest.mark.parametrize("kind", ["intercepted", "plain"])
def test_stalled_client_does_not_make_the_proxy_buffer(
    fast_proxy: ProxyProc, upstream: Upstream, kind: str
) -> None:
    """A client that stops reading: backpressure reaches the upstream instead of the proxy's memory."""
    pid = fast_proxy.proc.pid
    size = 256 * 1024 * 1024
    still_serves(fast_proxy)  # warm up
    before = proc_mem_kib(pid)
    s: socket.socket
    if kind == "intercepted":
        s = tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy))
        s.sendall(f"GET /size/{size} HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n".encode())
    else:
        s = socket.create_connection(("127.0.0.1", fast_proxy.port), timeout=30)
        host = "Host: data.commoncrawl.org\r\n"
        s.sendall(f"GET http://data.commoncrawl.org/size/{size} HTTP/1.1\r\n{host}\r\n".encode())
    with s:
        s.recv(1024)  # the answer has started
        # Give the upstream every chance to push the whole body into the proxy while we read nothing.

        def relayed() -> float:
            return metric_value(fast_proxy, "politeproxy_bytes_total", 'direction="upstream_to_client"')

        last = -1.0
        for _ in range(100):
            time.sleep(0.1)
            now = relayed()
            if now == last:
                break
            last = now
        time.sleep(1.0)
        after = proc_mem_kib(pid)
        grew = (after["VmHWM"] - before["VmHWM"]) / 1024
        assert grew < 64, f"peak RSS grew by {grew:.1f} MiB with a stalled client ({before} -> {after})"
        assert relayed() < size / 2, (
            "the proxy claims to have relayed most of the body to a client that read nothing"
        )
    still_serves(fast_proxy)


def test_256mib_upload_streams_in_bounded_memory(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    size = 256 * 1024 * 1024
    pid = fast_proxy.proc.pid
    with requests.Session() as s:
        s.trust_env = False
        s.proxies = proxies(fast_proxy)
        s.verify = str(bundle(fast_proxy))
        r = s.post("https://data.commoncrawl.org/echo", data=_blocks(4 * 1024 * 1024), timeout=60)  # warm up
        assert r.status_code == 200
        before = proc_mem_kib(pid)
        r = s.post("https://data.commoncrawl.org/echo", data=_blocks(size, 1 << 20), timeout=240)
        after = proc_mem_kib(pid)
    assert r.status_code == 200, r.text
    assert r.json()["body_length"] == size
    grew = (after["VmHWM"] - before["VmHWM"]) / 1024
    assert grew < 64, f"peak RSS grew by {grew:.1f} MiB streaming a 256 MiB upload ({before} -> {after})"


def test_plain_keepalive_and_pipelining(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    """The first request head is read by the front parser, the rest by aiohttp: nothing may be lost."""
    host = "Host: data.commoncrawl.org\r\n"
    body = b"b" * 100_000
    length = f"Content-Length: {len(body)}\r\n"
    post = f"POST http://data.commoncrawl.org/echo?n=0 HTTP/1.1\r\n{host}{length}\r\n".encode() + body
    gets = b"".join(
        f"GET http://data.commoncrawl.org/echo?n={i} HTTP/1.1\r\n{host}\r\n".encode() for i in range(1, 4)
    )
    with socket.create_connection(("127.0.0.1", fast_proxy.port), timeout=30) as s:
        s.sendall(post + gets)  # four pipelined requests in one write, the first with a body
        bodies = [json.loads(b) for b in read_pipelined(s, 4)]
        assert [b["path"] for b in bodies] == [f"/echo?n={i}" for i in range(4)]
        assert bodies[0]["sha256"] == hashlib.sha256(body).hexdigest()
        # And a later request on the same connection, to another host.
        s.sendall(b"GET http://other.example/echo?n=4 HTTP/1.1\r\nHost: other.example\r\n\r\n")
        assert json.loads(read_pipelined(s, 1)[0])["host"] == "other.example"
    assert [a["path"] for a in arrivals(upstream, "/echo")] == [f"/echo?n={i}" for i in range(5)]


def test_pipelined_requests_inside_a_tunnel(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    host = "Host: data.commoncrawl.org\r\n"
    with tls_through_proxy(fast_proxy.port, "data.commoncrawl.org", ca_pem(fast_proxy)) as s:
        s.sendall(b"".join(f"GET /echo?p={i} HTTP/1.1\r\n{host}\r\n".encode() for i in range(5)))
        bodies = [json.loads(b) for b in read_pipelined(s, 5)]
        assert [b["path"] for b in bodies] == [f"/echo?p={i}" for i in range(5)]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_data_path_on_each_event_loop(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs, loop: str
) -> None:
    """The same data path on the standard asyncio loop (start_tls differs between the loops)."""
    p = start_with(proxy_factory, upstream, certs, env={"POLITEPROXY_EVENT_LOOP": loop})
    assert f"event loop: {loop}" in p.log()
    host = "Host: data.commoncrawl.org\r\n"
    with tls_through_proxy(p.port, "data.commoncrawl.org", ca_pem(p)) as s:
        # Pipelined requests right after the handshake: nothing read with the ClientHello may be lost.
        s.sendall(b"".join(f"GET /echo?l={i} HTTP/1.1\r\n{host}\r\n".encode() for i in range(3)))
        assert [json.loads(b)["path"] for b in read_pipelined(s, 3)] == [f"/echo?l={i}" for i in range(3)]
        resp = exchange(s, f"GET /size/300000?chunked=1 HTTP/1.1\r\n{host}\r\n".encode())
        assert resp.data == b"x" * 300000  # type: ignore[attr-defined]
        data = os.urandom(2_000_000)
        resp = exchange(
            s, f"POST /echo HTTP/1.1\r\n{host}Content-Length: {len(data)}\r\n\r\n".encode() + data
        )
        assert json.loads(resp.data)["sha256"] == hashlib.sha256(data).hexdigest()  # type: ignore[attr-defined]
    # A blind tunnel, plain http://, and bad TLS that must not hurt the loop.
    with tls_through_proxy(p.port, "other.example", certs.ca_file) as s:
        assert exchange(s, b"GET /x HTTP/1.1\r\nHost: other.example\r\n\r\n").status == 200
    r = requests.get("http://data.commoncrawl.org/echo?plain=1", proxies=proxies(p), timeout=30)
    assert r.json()["path"] == "/echo?plain=1"
    s2, head = connect_tunnel(p.port, "data.commoncrawl.org:443")
    assert head.startswith(b"HTTP/1.1 200")
    s2.sendall(b"not tls at all\r\n\r\n")
    s2.settimeout(30)
    try:
        assert s2.recv(100) == b""
    except ConnectionResetError:
        pass
    s2.close()
    still_serves(p)
    assert "Traceback" not in p.log(), p.log()
