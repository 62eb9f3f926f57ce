"""The same data path on the standard asyncio loop and on uvloop (start_tls differs between the loops).
Each case starts its own proxy: the loop is chosen by an environment variable at start.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import requests

from tests.support.proxyio import (
    ProxyFactory,
    ca_pem,
    connect_tunnel,
    exchange,
    proxies,
    read_pipelined,
    start_with,
    still_serves,
    tls_through_proxy,
)
from tests.support.upstream_proc import Certs, Upstream


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
    # A request body, to the web site: data.commoncrawl.org refuses a POST by its form (issue 42)
    with tls_through_proxy(p.port, "commoncrawl.org", ca_pem(p)) as s:
        data = os.urandom(2_000_000)
        www = "Host: commoncrawl.org\r\n"
        resp = exchange(s, f"POST /echo HTTP/1.1\r\n{www}Content-Length: {len(data)}\r\n\r\n".encode() + data)
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
