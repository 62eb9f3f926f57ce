"""The cache tests' raw TLS upstream and proxy: a server that misbehaves on purpose (a short 206, a body cut
mid-stream, a stalled body), a proxy that sends the S3 name to it, and one request through the proxy.

The raw upstream stands in for commoncrawl.s3.amazonaws.com only; data.commoncrawl.org stays the fake
upstream. Arrivals are counted by the raw upstream itself. A test module takes the ``raw`` fixture by
assigning ``raw = raw_fixture()`` (one raw upstream per module).
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.proxyio import upstream_toml
from tests.support.upstream_proc import Certs, start_upstream

S3 = "commoncrawl.s3.amazonaws.com"


D = "data.commoncrawl.org"


# Paced requests one per 10 ms: the tests count requests, not the schedule.
# No backoff, block or retry: an error answer is passed on as it is, and the next request goes out.
CACHE_TOML = (
    NO_ROBOTS
    + '[schedule]\nbackend = "memory"\nglobal_rate = "10ms"\n'
    + "[pacing]\nthrottle_codes = []\nblock_codes = []\nretries = 0\n"
)


def body_for(path: str, n: int = 1000) -> bytes:
    seed = path.encode()
    return (seed * (n // max(1, len(seed)) + 1))[:n]


class RawUpstream:
    """A TLS server that writes its answers byte by byte as told by the path, one request per connection.

    /crawl-data/short206*   206 "bytes 0-4/1000" with 5 bytes, whatever range was asked
    /crawl-data/cut*        Content-Length 1000, 500 bytes, then a reset
    /crawl-data/stall*      Content-Length 4 MiB; the first request gets 1 MiB then nothing until it is
                            closed, later ones the whole body
    anything else           200 with body_for(path)
    """

    def __init__(self, certs: Certs) -> None:
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(certs.server_pem)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.arrivals: list[str] = []
        self.stalled = threading.Event()  # set once a stalled body has sent its first MiB
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for p in self.arrivals if p.startswith(prefix))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(30)
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as s:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = s.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                path = head.split(b" ", 2)[1].decode()
                with self.lock:
                    self.arrivals.append(path)
                    first = sum(1 for p in self.arrivals if p == path) == 1
                self._answer(s, path, first)
                if not path.startswith("/crawl-data/cut"):
                    self._close_gently(s)
        except (OSError, ssl.SSLError):
            pass

    def _answer(self, s: ssl.SSLSocket, path: str, first: bool) -> None:
        if path.startswith("/crawl-data/short206"):
            head = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-4/1000\r\nContent-Length: 5\r\n"
            s.sendall(head + b"\r\n01234")
        elif path.startswith("/crawl-data/cut"):
            s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"c" * 500)
            time.sleep(0.3)  # the head and half the body reach the proxy before the reset
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        elif path.startswith("/crawl-data/stall"):
            n = 4 << 20
            s.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode())
            body = body_for(path, n)
            if first:
                s.sendall(body[: 1 << 20])
                self.stalled.set()
                s.settimeout(60)
                while s.recv(4096):  # until the proxy goes away
                    pass
                return
            s.sendall(body)
        else:
            body = body_for(path)
            s.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "e1"\r\n\r\n' % len(body) + body)

    @staticmethod
    def _close_gently(s: ssl.SSLSocket) -> None:
        """TLS close_notify, then FIN, as well-kept servers close. A bare TCP close loses the end of a
        body on the proxy's side when uvloop has paused reading (it drops what it holds on a TCP EOF
        without close_notify: MagicStack/uvloop#661; docs/failure-modes.md): the kill -9 test's second
        fetch came out cut about one run in five on a loaded box."""
        plain = s.unwrap()
        plain.shutdown(socket.SHUT_WR)
        while plain.recv(4096):
            pass

    def close(self) -> None:
        self.sock.close()


def fetch(
    p: ProxyProc,
    host: str,
    path: str,
    headers: dict[str, str] | None = None,
    pipeline: str | None = None,
    method: str = "GET",
) -> tuple[int, dict[str, str], bytes]:
    """One request through ``p``'s CONNECT tunnel; ``pipeline`` names it by the proxy user name."""
    proxy = urllib.parse.urlsplit(p.env["HTTPS_PROXY"])
    ctx = ssl.create_default_context(cafile=p.env["SSL_CERT_FILE"])
    c = http.client.HTTPSConnection(proxy.hostname or "127.0.0.1", proxy.port, context=ctx, timeout=60)
    try:
        tunnel: dict[str, str] = {}
        if pipeline:
            tunnel["Proxy-Authorization"] = "Basic " + base64.b64encode(f"{pipeline}:".encode()).decode()
        c.set_tunnel(host, 443, headers=tunnel)
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        try:
            body = r.read()
        except http.client.IncompleteRead as e:
            body = b"<cut>" + e.partial
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        c.close()


def raw_fixture(name: str = "raw") -> Callable[..., Any]:
    """A module-scoped pytest fixture ``name`` yielding a :class:`RawUpstream`; assign it in a test module
    (pytest finds fixtures by name, so the module that uses it holds it)."""

    @pytest.fixture(name=name, scope="module")
    def _fixture(certs: Certs) -> Iterator[RawUpstream]:
        r = RawUpstream(certs)
        yield r
        r.close()

    return _fixture


def start_cache_proxy(tmp: Path, certs: Certs, raw: RawUpstream, extra: str = "", **kw: object) -> ProxyProc:
    """A proxy with data.commoncrawl.org on a fake upstream and the S3 name on ``raw``."""
    up = kw.pop("up", None) or start_upstream(certs, tmp)
    text = CACHE_TOML + extra + upstream_toml(up, certs, {f"{S3}:443": f"127.0.0.1:{raw.port}"})  # type: ignore[arg-type]
    return start_proxy(tmp, None, None, text, **kw)  # type: ignore[arg-type]
