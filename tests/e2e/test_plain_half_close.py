"""Issue 42 item 7, from outside (a raw socket to the proxy port, the fake upstream's arrival log): a client
that half-closes after a plain ``http://`` request gets its answer (RFC 9112 section 9.6 lets a client
close its sending side and still read the response), never a silence after its request went upstream and
spent a slot. The finding: no answer, though the request reached the upstream.

Written against the proxy's outside (sockets, not classes), so it holds across the one-stack rewrite.
"""

from __future__ import annotations

import socket
import time
import uuid

from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream

D = "data.commoncrawl.org"


def read_to_end(s: socket.socket, seconds: float = 20.0) -> bytes:
    """Everything the proxy sends until it closes (bounded: the test fails rather than hangs)."""
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return out
        out += chunk
    raise AssertionError(f"the proxy kept the connection open; read so far: {out[:200]!r}")


def half_closed(proxy: ProxyProc, requests: list[str]) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2.0) as s:
        s.sendall("".join(f"GET http://{D}{p} HTTP/1.1\r\nHost: {D}\r\n\r\n" for p in requests).encode())
        s.shutdown(socket.SHUT_WR)  # the request is all this client will send: it reads the answer now
        return read_to_end(s)


def test_a_half_closed_plain_client_gets_its_answer(proxy: ProxyProc, upstream: Upstream) -> None:
    path = f"/size/64?half={uuid.uuid4().hex}"
    data = half_closed(proxy, [path])
    went = sum(a["path"] == path for a in upstream.log())
    assert went == 1, (went, data[:300], [a["path"] for a in upstream.log()][-3:])
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data[:200]
    assert len(body) == 64, (len(body), data[:200])


def test_a_half_closed_client_that_pipelined_gets_an_answer_for_each_request_sent(
    proxy: ProxyProc, upstream: Upstream
) -> None:
    """Two requests, then the half-close: the first is answered; the second may be answered or never sent
    (a server may close after any answer; the client then knows it was not handled), never sent unanswered."""
    paths = [f"/size/32?half2={uuid.uuid4().hex}-{i}" for i in range(2)]
    data = half_closed(proxy, paths)
    went = [sum(a["path"] == p for a in upstream.log()) for p in paths]
    assert went[0] == 1 and went[1] in (0, 1), went
    assert data.count(b"HTTP/1.1 200") == sum(went), (went, data[:400])


def test_a_half_close_before_the_head_is_complete_sends_nothing(proxy: ProxyProc, upstream: Upstream) -> None:
    """No complete request: nothing goes upstream, and the connection closes (no answer is owed)."""
    path = f"/size/16?cut={uuid.uuid4().hex}"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=2.0) as s:
        s.sendall(f"GET http://{D}{path} HTTP/1.1\r\nHost: {D}\r\n".encode())  # no blank line
        s.shutdown(socket.SHUT_WR)
        read_to_end(s)
    time.sleep(0.2)
    assert not any(a["path"] == path for a in upstream.log())
