"""Item 9: bad input gets a 4xx/5xx with a one-line reason or a clean close, one log line, and the proxy
keeps serving everyone else. Every test ends with a normal request through the same proxy."""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import certifi
import pytest
import requests

from tests.support.processes import free_port, wait_for
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import (
    ProxyFactory,
    bundle,
    ca_pem,
    connect_tunnel,
    exchange,
    no_tracebacks,
    one_line_reason,
    proxies,
    raw,
    read_head,
    read_to_close,
    start_with,
    still_serves,
    tls_through_proxy,
)
from tests.support.upstream_proc import Certs, Upstream

# Small client timeouts so the slow-client cases are quick; generous waits so a noisy box passes.
SMALL_TIMEOUTS = '[client]\nhandshake_timeout = "0.5s"\nheader_timeout = "0.5s"\nidle_timeout = "1s"\n'
WAIT = 30.0


@pytest.fixture(scope="module")
def module_bp(module_proxy_factory: ProxyFactory, module_upstream: Upstream, certs: Certs) -> ProxyProc:
    """A proxy with small client timeouts and max_header_size 4096, shared by the module's bp cases:
    each sends bad input and then checks the same proxy still serves (and never logged a traceback)."""
    extra = SMALL_TIMEOUTS + "max_header_size = 4096\n"
    return start_with(module_proxy_factory, module_upstream, certs, extra)


@pytest.fixture
def bp(module_bp: ProxyProc) -> ProxyProc:
    return for_this_test(module_bp)


@pytest.fixture
def upstream(shared_upstream: Upstream) -> Upstream:
    """The module's one fake upstream, reset before each test."""
    return shared_upstream


def closed_within(s: socket.socket, timeout: float = WAIT) -> bytes:
    """Everything the proxy sends until it closes ``s``; fails if it does not close in ``timeout``."""
    s.settimeout(timeout)
    try:
        return read_to_close(s)
    except TimeoutError:
        pytest.fail(f"the proxy kept the connection open for more than {timeout}s")
    except ssl.SSLError:
        return b""


# -- malformed input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"this is not http\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET http://data.commoncrawl.org/ HTTP/1.1\r\nHost data.commoncrawl.org\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n",  # TLS at the proxy port
    ],
)
def test_malformed_request_line(bp: ProxyProc, upstream: Upstream, data: bytes) -> None:
    head, body = raw(bp.port, data)
    assert head.startswith(b"HTTP/1.1 400"), head
    one_line_reason(body)
    still_serves(bp)
    assert upstream.log()[:-1] == []  # only still_serves reached the upstream
    no_tracebacks(bp)


def test_oversized_headers(bp: ProxyProc, upstream: Upstream) -> None:
    big = "a" * 8000
    # The first request head on a connection (read by the front parser).
    host = "Host: data.commoncrawl.org\r\n"
    head, body = raw(
        bp.port, f"GET http://data.commoncrawl.org/ HTTP/1.1\r\n{host}X-Big: {big}\r\n\r\n".encode()
    )
    assert head.split(b" ")[1] in (b"431", b"400"), head
    one_line_reason(body)
    head, _ = raw(
        bp.port, f"CONNECT data.commoncrawl.org:443 HTTP/1.1\r\n{host}X-Big: {big}\r\n\r\n".encode()
    )
    assert head.split(b" ")[1] in (b"431", b"400"), head
    # Inside an intercepted tunnel (read by aiohttp's parser).
    with tls_through_proxy(bp.port, "data.commoncrawl.org", ca_pem(bp)) as s:
        s.sendall(f"GET /echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\nX-Big: {big}\r\n\r\n".encode())
        head = read_head(s)
        assert head.split(b" ")[1] in (b"431", b"400"), head
        closed_within(s)
    # Many headers, each small, adding up to too much.
    many = "".join(f"X-H{i}: {'b' * 50}\r\n" for i in range(200))
    head, _ = raw(
        bp.port,
        f"GET http://data.commoncrawl.org/ HTTP/1.1\r\nHost: data.commoncrawl.org\r\n{many}\r\n".encode(),
    )
    assert head.split(b" ")[1] in (b"431", b"400"), head
    still_serves(bp)
    assert [a["path"] for a in upstream.log()] == ["/echo?still=1"]
    no_tracebacks(bp)


@pytest.mark.parametrize(
    "target",
    [
        "data.commoncrawl.org",
        "data.commoncrawl.org:",
        "data.commoncrawl.org:https",
        "data.commoncrawl.org:0",
        "data.commoncrawl.org:65536",
        "data.commoncrawl.org:-1",
        ":443",
        "other.example:99999999999999999999",
    ],
)
def test_connect_without_a_valid_port(bp: ProxyProc, upstream: Upstream, target: str) -> None:
    head, body = raw(bp.port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "host:port" in one_line_reason(body)
    still_serves(bp)
    no_tracebacks(bp)


def test_non_tls_bytes_in_an_intercepted_tunnel(bp: ProxyProc, upstream: Upstream) -> None:
    s, head = connect_tunnel(bp.port, "data.commoncrawl.org:443")
    assert head.startswith(b"HTTP/1.1 200")
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
    closed_within(s)  # a clean close: no plain-text answer inside what should be TLS matters
    s.close()
    still_serves(bp)
    wait_for(lambda: "TLS handshake for data.commoncrawl.org failed" in bp.log_since(), WAIT, "log line")
    lines = [x for x in bp.log_since().splitlines() if "TLS handshake" in x]
    assert len(lines) == 1, lines
    assert [a["path"] for a in upstream.log()] == ["/echo?still=1"]
    no_tracebacks(bp)


def test_client_that_does_not_trust_the_ca(bp: ProxyProc, upstream: Upstream) -> None:
    s, head = connect_tunnel(bp.port, "data.commoncrawl.org:443")
    assert head.startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=certifi.where())  # public roots only, not our CA
    with pytest.raises(ssl.SSLCertVerificationError):
        ctx.wrap_socket(s, server_hostname="data.commoncrawl.org")
    s.close()
    wait_for(lambda: "TLS handshake for data.commoncrawl.org failed" in bp.log_since(), WAIT, "log line")
    still_serves(bp)
    lines = [x for x in bp.log_since().splitlines() if "TLS handshake" in x]
    assert len(lines) == 1, lines
    assert "ca.pem" in lines[0]  # the line says what to do
    no_tracebacks(bp)


# -- upstream failures -----------------------------------------------------------------------------


def test_unresolvable_host(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> None:
    # A paced host with no resolve mapping (the .invalid TLD never resolves, RFC 6761).
    p = start_with(
        proxy_factory,
        upstream,
        certs,
        top='paced_hosts = ["commoncrawl.org", "*.commoncrawl.org", "pp-test.invalid"]\n',
    )
    with tls_through_proxy(p.port, "pp-test.invalid", ca_pem(p)) as s:
        resp = exchange(s, b"GET /x HTTP/1.1\r\nHost: pp-test.invalid\r\n\r\n")
        assert resp.status == 502
        assert "pp-test.invalid" in one_line_reason(resp.data)  # type: ignore[attr-defined]
    # A passthrough host, plain http:// and CONNECT (blind tunnel).
    r = requests.get("http://nonexistent.invalid/x", proxies=proxies(p), timeout=WAIT)
    assert r.status_code == 502
    assert "nonexistent.invalid" in one_line_reason(r.content)
    head, body = raw(
        p.port, b"CONNECT nonexistent.invalid:443 HTTP/1.1\r\nHost: nonexistent.invalid:443\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 502"), head
    assert "nonexistent.invalid" in one_line_reason(body)
    still_serves(p)
    assert [a["path"] for a in upstream.log()] == ["/echo?still=1"]
    no_tracebacks(p)


def test_upstream_connect_refused(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> None:
    dead = free_port()  # nothing listens there
    p = start_with(
        proxy_factory,
        upstream,
        certs,
        resolve={
            "index.commoncrawl.org:443": f"127.0.0.1:{dead}",
            "other.example:443": f"127.0.0.1:{dead}",
            "other.example:80": f"127.0.0.1:{dead}",
        },
    )
    with tls_through_proxy(p.port, "index.commoncrawl.org", ca_pem(p)) as s:
        resp = exchange(s, b"GET /x HTTP/1.1\r\nHost: index.commoncrawl.org\r\n\r\n")
        assert resp.status == 502
        assert "index.commoncrawl.org" in one_line_reason(resp.data)  # type: ignore[attr-defined]
    r = requests.get("http://other.example/x", proxies=proxies(p), timeout=WAIT)
    assert r.status_code == 502
    one_line_reason(r.content)
    head, body = raw(p.port, b"CONNECT other.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502"), head
    one_line_reason(body)
    still_serves(p)
    no_tracebacks(p)


@pytest.mark.slow  # waits out a 1 s upstream read timeout twice (answers after 4 s)
def test_upstream_read_timeout(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> None:
    p = start_with(proxy_factory, upstream, certs, up_settings={"read_timeout": '"1s"'})
    with tls_through_proxy(p.port, "data.commoncrawl.org", ca_pem(p)) as s:
        resp = exchange(s, b"GET /slow?delay=4 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
        assert resp.status == 504
        one_line_reason(resp.data)  # type: ignore[attr-defined]
    r = requests.get("http://other.example/slow?delay=4", proxies=proxies(p), timeout=WAIT)
    assert r.status_code == 504
    one_line_reason(r.content)
    still_serves(p)
    no_tracebacks(p)


# -- slow and idle clients -------------------------------------------------------------------------


def test_header_timeout_on_the_first_request(bp: ProxyProc) -> None:
    with socket.create_connection(("127.0.0.1", bp.port), timeout=WAIT) as s:
        s.sendall(b"GET http://data.commoncrawl.org/echo HTTP/1.1\r\nHost: data.")  # and then nothing
        out = closed_within(s)
        assert out == b"" or out.startswith(b"HTTP/1.1 408"), out
    with socket.create_connection(("127.0.0.1", bp.port), timeout=WAIT) as s:
        out = closed_within(s)  # connects and says nothing at all
        assert out == b"" or out.startswith(b"HTTP/1.1 408"), out
    still_serves(bp)
    no_tracebacks(bp)


def test_handshake_timeout(bp: ProxyProc) -> None:
    s, head = connect_tunnel(bp.port, "data.commoncrawl.org:443")
    assert head.startswith(b"HTTP/1.1 200")
    closed_within(s)  # never sends a ClientHello
    s.close()
    still_serves(bp)
    no_tracebacks(bp)


@pytest.mark.slow  # waits out the 0.5 s header timeout (the first-request case stays quick)
def test_header_timeout_inside_an_intercepted_tunnel(bp: ProxyProc, upstream: Upstream) -> None:
    with tls_through_proxy(bp.port, "data.commoncrawl.org", ca_pem(bp)) as s:
        s.sendall(b"GET /echo HTTP/1.1\r\nHost: data.")  # a slow-loris head
        t0 = time.monotonic()
        out = closed_within(s)
        assert out == b"" or out.startswith(b"HTTP/1.1 408"), out
        assert time.monotonic() - t0 < WAIT
    still_serves(bp)
    no_tracebacks(bp)


@pytest.mark.slow  # waits out the 0.5 s header timeout (the first-request case stays quick)
def test_header_timeout_on_a_later_plain_request(bp: ProxyProc, upstream: Upstream) -> None:
    with socket.create_connection(("127.0.0.1", bp.port), timeout=WAIT) as s:
        resp = exchange(
            s, b"GET http://data.commoncrawl.org/size/3 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n"
        )
        assert resp.status == 200
        s.sendall(b"GET http://data.commoncrawl.org/echo HTTP/1.1\r\nHo")
        out = closed_within(s)
        assert out == b"" or out.startswith(b"HTTP/1.1 408"), out
    still_serves(bp)


# Each case waits out the 1 s idle timeout: the intercepted one stays quick, the other two are slow.
@pytest.mark.parametrize(
    "kind",
    [
        "intercepted",
        pytest.param("plain", marks=pytest.mark.slow),
        pytest.param("tunnel", marks=pytest.mark.slow),
    ],
)
def test_idle_keepalive_is_closed(bp: ProxyProc, upstream: Upstream, certs: Certs, kind: str) -> None:
    s: socket.socket
    if kind == "intercepted":
        s = tls_through_proxy(bp.port, "data.commoncrawl.org", ca_pem(bp))
        req = b"GET /size/3 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n"
    elif kind == "plain":
        s = socket.create_connection(("127.0.0.1", bp.port), timeout=WAIT)
        req = b"GET http://data.commoncrawl.org/size/3 HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n"
    else:
        s = tls_through_proxy(bp.port, "other.example", certs.ca_file)
        req = b"GET /size/3 HTTP/1.1\r\nHost: other.example\r\n\r\n"
    with s:
        resp = exchange(s, req)
        assert resp.status == 200 and resp.data == b"xxx"  # type: ignore[attr-defined]
        assert resp.getheader("Connection", "").lower() != "close"
        assert closed_within(s) == b""  # idle_timeout = 1s closes the kept-alive connection
    still_serves(bp)
    no_tracebacks(bp)


def test_many_bad_clients_at_once_do_not_stop_a_good_one(bp: ProxyProc, tmp_path: Path) -> None:
    socks = [socket.create_connection(("127.0.0.1", bp.port), timeout=WAIT) for _ in range(50)]
    try:
        for i, s in enumerate(socks):
            s.sendall(b"GET http://data.commoncrawl.org/ HTTP/1.1\r\n" if i % 2 else b"CONNECT data.")
        still_serves(bp)
    finally:
        for s in socks:
            s.close()
    still_serves(bp)
    no_tracebacks(bp)


@pytest.mark.slow  # waits out a 1 s connect timeout
def test_upstream_connect_timeout(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> None:
    # A listener that never accepts nor answers: the TCP handshake completes in the kernel, TLS never
    # does, so the proxy's connect timeout (which covers the TLS handshake) must answer 504.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        p = start_with(
            proxy_factory,
            upstream,
            certs,
            resolve={"data.commoncrawl.org:443": f"127.0.0.1:{port}"},
            up_settings={"connect_timeout": '"1s"', "read_timeout": '"30s"'},
        )
        with tls_through_proxy(p.port, "data.commoncrawl.org", ca_pem(p)) as s:
            resp = exchange(s, b"GET /echo HTTP/1.1\r\nHost: data.commoncrawl.org\r\n\r\n")
            assert resp.status == 504
            assert b"timed out" in resp.data  # type: ignore[attr-defined]
            one_line_reason(resp.data)  # type: ignore[attr-defined]
    # data.commoncrawl.org still points at the closed listener (and is backing off): another host answers.
    r = requests.get(
        "https://index.commoncrawl.org/echo", proxies=proxies(p), verify=str(bundle(p)), timeout=WAIT
    )
    assert r.status_code == 200
    no_tracebacks(p)
