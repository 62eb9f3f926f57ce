"""Issue 9 items 13, 20, 21 and 24 (listener part): bounded heads on every request, max_connections,
and a listener that owns its connections, timers, tasks and tunnels until shutdown."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from politeproxy.app import App
from politeproxy.config import loading as config
from tests.support.processes import wait_for
from tests.support.proxy_proc import ProxyProc
from tests.support.proxyio import (
    ProxyFactory,
    ca_pem,
    connect_tunnel,
    exchange,
    metric_value,
    no_tracebacks,
    one_line_reason,
    proc_mem_kib,
    read_head,
    read_to_close,
    start_with,
    still_serves,
    tls_through_proxy,
)
from tests.support.upstream_proc import Certs, Upstream

# 120 fields of 16 KiB: each line is under the default max_header_size (32 KiB) and the count under
# aiohttp's max_headers (128), so only a bound on the whole head refuses it. About 1.9 MiB.
BIG_FIELDS = "".join(f"X-Big-{i}: {'b' * 16384}\r\n" for i in range(120))


class RawUpstream:
    """An HTTP/1.1 server that answers every head with a 2-byte 200 and records what arrived."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.tls = tls
        self.received = 0
        self.lines: list[str] = []
        self.stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(20)
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
            buf = b""
            while data := conn.recv(65536):
                self.received += len(data)
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    self.lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop = True
        self.sock.close()


@pytest.fixture
def raw_upstreams(certs: Certs) -> Iterator[tuple[RawUpstream, RawUpstream]]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_pem)
    plain, tls = RawUpstream(), RawUpstream(ctx)
    yield plain, tls
    plain.close()
    tls.close()


def raw_proxy(
    factory: ProxyFactory, up: Upstream, certs: Certs, raws: tuple[RawUpstream, RawUpstream]
) -> ProxyProc:
    plain, tls = raws
    resolve = {
        "other.example:80": f"127.0.0.1:{plain.port}",
        "data.commoncrawl.org:443": f"127.0.0.1:{tls.port}",
    }
    return start_with(factory, up, certs, resolve=resolve)


def big_second_request(s: socket.socket, target: str, host: str) -> bytes:
    """A small request, then a ~1.9 MiB head on the same connection; what the proxy answers to it."""
    resp = exchange(s, f"GET {target}first HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert resp.status == 200 and resp.data == b"ok"  # type: ignore[attr-defined]
    try:
        s.sendall(f"GET {target}second HTTP/1.1\r\nHost: {host}\r\n{BIG_FIELDS}\r\n".encode())
    except OSError:
        pass  # the proxy may close before it has read everything
    try:
        return read_head(s)
    except OSError:
        return b""


def serves(p: ProxyProc) -> None:
    """A normal plain request through ``p`` still gets its answer (from the raw upstream)."""
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        resp = exchange(s, b"GET http://other.example/after HTTP/1.1\r\nHost: other.example\r\n\r\n")
        assert resp.status == 200 and resp.data == b"ok"  # type: ignore[attr-defined]


def refused_as_too_big(head: bytes) -> None:
    assert head == b"" or head.split(b" ")[1] in (b"431", b"400"), head[:200]


@pytest.mark.slow  # a proxy of its own and two raw upstreams: ~3 s
def test_big_head_as_a_later_request_never_goes_upstream(
    proxy_factory: ProxyFactory,
    upstream: Upstream,
    certs: Certs,
    raw_upstreams: tuple[RawUpstream, RawUpstream],
) -> None:
    p = raw_proxy(proxy_factory, upstream, certs, raw_upstreams)
    plain, tls = raw_upstreams
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        refused_as_too_big(big_second_request(s, "http://other.example/", "other.example"))
    with tls_through_proxy(p.port, "data.commoncrawl.org", ca_pem(p)) as s:
        refused_as_too_big(big_second_request(s, "/", "data.commoncrawl.org"))
    time.sleep(0.5)
    assert plain.lines == ["GET /first HTTP/1.1"] and tls.lines == ["GET /first HTTP/1.1"]
    assert plain.received < 4096 and tls.received < 4096
    assert metric_value(p, "politeproxy_rejected_total", 'reason="bad_request"') >= 2
    serves(p)
    no_tracebacks(p)  # one line each, no aiohttp "Error handling request" traceback


@pytest.mark.slow  # a proxy of its own: ~2 s
def test_head_that_completes_in_one_read_is_checked_whole(
    proxy_factory: ProxyFactory,
    upstream: Upstream,
    certs: Certs,
    raw_upstreams: tuple[RawUpstream, RawUpstream],
) -> None:
    p = start_with(
        proxy_factory,
        upstream,
        certs,
        "[client]\nmax_header_size = 4096\n",
        resolve={"other.example:80": f"127.0.0.1:{raw_upstreams[0].port}"},
    )
    # Both requests in one send: the second head (about 6 KiB, lines of 1 KiB) arrives whole.
    fields = "".join(f"X-H{i}: {'c' * 1000}\r\n" for i in range(6))
    first = b"GET http://other.example/first HTTP/1.1\r\nHost: other.example\r\n\r\n"
    second = f"GET http://other.example/second HTTP/1.1\r\nHost: other.example\r\n{fields}\r\n".encode()
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        s.sendall(first + second)
        out = read_to_close(s)
    assert b"HTTP/1.1 431" in out, out[-300:]
    assert one_line_reason(out.split(b"\r\n\r\n")[-1])
    assert raw_upstreams[0].lines == ["GET /first HTTP/1.1"]
    no_tracebacks(p)


@pytest.mark.slow
def test_many_big_heads_keep_memory_bounded(
    proxy_factory: ProxyFactory,
    upstream: Upstream,
    certs: Certs,
    raw_upstreams: tuple[RawUpstream, RawUpstream],
) -> None:
    p = raw_proxy(proxy_factory, upstream, certs, raw_upstreams)
    serves(p)
    before = proc_mem_kib(p.proc.pid)["VmRSS"]
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with socket.create_connection(("127.0.0.1", p.port), timeout=60) as s:
                refused_as_too_big(big_second_request(s, "http://other.example/", "other.example"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    peak = proc_mem_kib(p.proc.pid)["VmHWM"]
    # 40 heads of 1.9 MiB: unbounded, the peak grew by 77 MiB here (each head parsed, copied and sent
    # upstream); bounded, each connection holds at most the limit plus one read (measured: +2 MiB).
    # The bound is loose on purpose (allocator noise on a shared box).
    assert peak - before < 40 * 1024, (before, peak)
    assert raw_upstreams[0].lines.count("GET /second HTTP/1.1") == 0
    serves(p)


def test_max_connections_counts_clients_and_tunnels(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    p = start_with(proxy_factory, upstream, certs, "[client]\nmax_connections = 4\n")
    idle = [socket.create_connection(("127.0.0.1", p.port), timeout=30) for _ in range(2)]
    tunnels = []
    for _ in range(2):
        s, head = connect_tunnel(p.port, "other.example:443")
        assert head.startswith(b"HTTP/1.1 200"), head
        tunnels.append(s)
    try:
        with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
            head = read_head(s)
            assert head.startswith(b"HTTP/1.1 503"), head
            assert "too many connections" in one_line_reason(read_to_close(s))
        tunnels.pop().close()  # a tunnel ends: its place is free again

        def served() -> bool:
            try:
                still_serves(p)
                return True
            except (AssertionError, requests.RequestException):
                return False  # 503 until the proxy has seen the tunnel close

        wait_for(served, 15, "a free connection place")
    finally:
        for s in idle + tunnels:
            s.close()
    assert metric_value(p, "politeproxy_rejected_total", 'reason="connections"') >= 1
    no_tracebacks(p)


# -- in process: what the listener owns ---------------------------------------------------------


def echo_server() -> tuple[socket.socket, list[socket.socket]]:
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def run() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)

    threading.Thread(target=run, daemon=True).start()
    return srv, conns


async def start_app(tmp_path: Path, resolve: dict[str, str]) -> App:
    cfg = config.build(
        {
            "schedule": {"backend": "memory", "global_rate": "0"},
            "robots": {"enabled": False},
            "client": {"header_timeout": "0.5s"},
            "upstream": {"resolve": resolve},
        },
        "test",
        {"listen": "127.0.0.1:0", "data_dir": str(tmp_path)},
    )
    app = App(cfg)
    await app.start()
    return app


async def test_close_ends_blind_tunnels_and_tasks(tmp_path: Path) -> None:
    srv, conns = echo_server()
    app = await start_app(tmp_path, {"other.example:443": f"127.0.0.1:{srv.getsockname()[1]}"})
    proxy = app.proxy
    assert proxy is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"CONNECT other.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
    await asyncio.wait_for(app.close(), 10)
    # The client sees its tunnel closed by the proxy's shutdown, not left open until the process ends.
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert not proxy.pairs and not proxy.tasks and proxy.open_tunnels == 0
    writer.close()
    srv.close()
    for c in conns:
        c.close()


async def test_header_timer_dies_with_its_client(tmp_path: Path) -> None:
    app = await start_app(tmp_path, {})
    proxy = app.proxy
    assert proxy is not None
    try:
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"GET http://other.example/ HTTP/1.1\r\nHo")  # a head that never ends
            await writer.drain()
            writer.close()
        await asyncio.sleep(1.5)  # three header timeouts (0.5 s)
        # A client that left is no 408: its timer went with it, and its place in max_connections.
        assert metric_value_in(app, 'reason="bad_request"') == 0
        assert not [t for t in proxy.clients if not t.is_closing()]
    finally:
        await app.close()


def metric_value_in(app: App, labels: str) -> float:
    text = app.metrics.render().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("politeproxy_rejected_total{") and labels in line
    )
