"""Proxy I/O end to end: intercepted, tunnelled and plain requests, connection reuse, the 421 refusal and
pipelining, through one FAST proxy process per module in front of the fake TLS upstream.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import ssl

import pytest
import requests

from tests.support.processes import wait_for
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import (
    arrivals,
    bundle,
    ca_pem,
    connect_tunnel,
    exchange,
    metric_value,
    proxies,
    read_pipelined,
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


def no_tunnel_open(p: ProxyProc) -> None:
    """Wait until earlier tests' tunnels on the shared proxy have closed."""
    wait_for(lambda: metric_value(p, "politeproxy_tunnels_open") == 0, 20, "earlier tunnels closed")


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
    no_tunnel_open(fast_proxy)
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
    no_tunnel_open(fast_proxy)
    with requests.Session() as s:
        s.trust_env = False  # REQUESTS_CA_BUNDLE in the environment would override s.verify
        s.proxies = proxies(fast_proxy)
        s.verify = str(bundle(fast_proxy))
        for i in range(10):
            r = s.get(f"https://data.commoncrawl.org/echo?n={i}", timeout=30)
            assert r.status_code == 200
        assert metric_value(fast_proxy, "politeproxy_tunnels_open") == 1
    assert len(arrivals(upstream, "/echo")) == 10


# -- the 421 cross-host refusal ---------------------------------------------------------------------


def test_421_cross_host_inside_tunnel(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    before = metric_value(fast_proxy, "politeproxy_rejected_total", 'reason="misdirected"')
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
    assert metric_value(fast_proxy, "politeproxy_rejected_total", 'reason="misdirected"') - before == 4


# -- pipelining -----------------------------------------------------------------------------------


def test_plain_keepalive_and_pipelining(fast_proxy: ProxyProc, upstream: Upstream) -> None:
    """The first request head is read by the front parser, the rest by aiohttp: nothing may be lost."""
    host = "Host: data.commoncrawl.org\r\n"
    body = b"b" * 100_000
    length = f"Content-Length: {len(body)}\r\n"
    # the body goes to the web site: data.commoncrawl.org refuses a POST by its form (issue 42)
    www = "Host: commoncrawl.org\r\n"
    post = f"POST http://commoncrawl.org/echo?n=0 HTTP/1.1\r\n{www}{length}\r\n".encode() + body
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
