"""Issue 9 items 8 and 11 end to end: CONNECT host validation and the destination policy.

Real proxy processes and real sockets. The non-loopback client is this machine's own non-loopback
address (the proxy listens on 0.0.0.0 and the client socket binds to that address, so the proxy sees a
peer that is not loopback); the full client matrix is in tests/unit/policy/test_routing.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import free_port, non_loopback_ip, wait_for
from tests.support.proxy_proc import ProxyProc, for_this_test
from tests.support.proxyio import (
    ProxyFactory,
    metric_value,
    no_tracebacks,
    one_line_reason,
    raw,
    read_head,
    read_to_close,
    start_with,
    still_serves,
)
from tests.support.upstream_proc import Certs, Upstream


class Listener:
    """A TCP service on 0.0.0.0 that echoes and counts the connections it accepts (Redis, say)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.sock.settimeout(0.2)
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.stop = True
        self.sock.close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def module_dp(module_proxy_factory: ProxyFactory, module_upstream: Upstream, certs: Certs) -> ProxyProc:
    """A FAST proxy with default destination rules, shared by the cases that only send refused requests."""
    return start_with(module_proxy_factory, module_upstream, certs)


@pytest.fixture
def dp(module_dp: ProxyProc) -> ProxyProc:
    return for_this_test(module_dp)


@pytest.fixture
def upstream(shared_upstream: Upstream) -> Upstream:
    """The module's one fake upstream, reset before each test."""
    return shared_upstream


@pytest.fixture
def service() -> Iterator[Listener]:
    s = Listener()
    yield s
    s.close()


def connect(
    port: int, target: str, source: str = "127.0.0.1", dest: str = "127.0.0.1"
) -> tuple[bytes, bytes]:
    """CONNECT ``target`` from ``source``; the answer head and body (until close, for a refusal)."""
    with socket.create_connection((dest, port), timeout=30, source_address=(source, 0)) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = read_head(s)
        return head, b"" if head.startswith(b"HTTP/1.1 200") else read_to_close(s)


def refused_count(p: ProxyProc) -> float:
    return metric_value(p, "politeproxy_rejected_total", 'reason="destination"')


@pytest.mark.parametrize(
    "target",
    [
        "../../x.commoncrawl.org:443",
        "/tmp/pp-abs/x.commoncrawl.org:443",
        "..x.commoncrawl.org:443",
        "a..commoncrawl.org:443",
        "x%2F..%2Fy.commoncrawl.org:443",
        "x_y.commoncrawl.org:443",
    ],
)
def test_hostile_connect_names_get_400_and_leave_no_file(dp: ProxyProc, target: str) -> None:
    p = dp
    root = p.data_dir.parent  # the proxy's directory: its data dir, config and log
    before = {q for q in root.rglob("*")}
    head, body = raw(p.port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "host" in one_line_reason(body)
    new = {q for q in root.rglob("*")} - before
    assert not [q for q in new if "commoncrawl" in q.name or "x.c" in q.name], new
    assert not Path("/tmp/pp-abs").exists()
    still_serves(p)
    no_tracebacks(p)


def test_connect_with_nul_in_the_name(dp: ProxyProc) -> None:
    p = dp
    head, body = raw(p.port, b"CONNECT x\x00.commoncrawl.org:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    one_line_reason(body)
    still_serves(p)


def test_absolute_form_host_is_validated(dp: ProxyProc, upstream: Upstream) -> None:
    p = dp
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        # The second request on a kept-alive connection goes through aiohttp's parser, not the front one.
        s.sendall(b"GET http://other.example/size/3 HTTP/1.1\r\nHost: other.example\r\n\r\n")
        assert read_head(s).startswith(b"HTTP/1.1 200")
        assert s.recv(3) == b"xxx"
        s.sendall(b"GET http://a..commoncrawl.org/x HTTP/1.1\r\nHost: a..commoncrawl.org\r\n\r\n")
        head = read_head(s)
    assert head.startswith(b"HTTP/1.1 400"), head
    assert [a["path"] for a in upstream.log()] == ["/size/3"]


def test_ports_outside_tunnel_ports_are_refused(dp: ProxyProc, service: Listener) -> None:
    p = dp  # tunnel_ports defaults to [443]
    refused_before = refused_count(p)
    for target in (f"localhost:{service.port}", f"127.0.0.1:{service.port}", "other.example:22"):
        head, body = connect(p.port, target)
        assert head.startswith(b"HTTP/1.1 403"), (target, head)
        assert "tunnel_ports" in one_line_reason(body)
    assert service.accepted == 0
    assert refused_count(p) - refused_before == 3
    assert connect(p.port, "other.example:443")[0].startswith(b"HTTP/1.1 200")  # 443 still tunnels
    no_tracebacks(p)


def test_connect_to_the_proxy_itself_is_refused_to_anyone(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    port = free_port()
    p = start_with(proxy_factory, upstream, certs, top=f"tunnel_ports = [443, {port}]\n", port=port)
    for target in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::ffff:127.0.0.1]:{port}", f"0.0.0.0:{port}"):
        head, body = connect(p.port, target)
        assert head.startswith(b"HTTP/1.1 403"), (target, head)
        assert "this proxy" in one_line_reason(body)
    # 200 nested CONNECTs in one send: one refusal, no tunnel.
    nested = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * 200
    head, _ = raw(p.port, nested)
    assert head.startswith(b"HTTP/1.1 403"), head
    assert metric_value(p, "politeproxy_tunnels_open") == 0
    # A plain request to the proxy's own address, port and all, is refused too.
    head, body = raw(
        p.port,
        f"GET http://127.0.0.1:{port}/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
    )
    assert head.startswith(b"HTTP/1.1 403"), head
    assert "this proxy" in one_line_reason(body)
    assert refused_count(p) == 6
    still_serves(p)
    no_tracebacks(p)


def test_refusals_are_logged_rate_limited(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs
) -> None:
    p = start_with(proxy_factory, upstream, certs)
    t0 = time.monotonic()
    for _ in range(30):
        assert connect(p.port, "localhost:6379")[0].startswith(b"HTTP/1.1 403")
    windows = int((time.monotonic() - t0) // 10) + 1  # 5 lines per client per 10 s window
    assert refused_count(p) == 30  # every refusal is counted ...
    lines = [x for x in p.log().splitlines() if "127.0.0.1: 403" in x]
    assert 1 <= len(lines) <= 5 * windows < 30, lines  # ... but one client's repeats are not all logged


@pytest.fixture
def outside_ip() -> str:
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback IPv4 address to be a non-loopback client from")
    return ip


def open_proxy(
    factory: ProxyFactory, up: Upstream, certs: Certs, ip: str, service: Listener, top: str = ""
) -> ProxyProc:
    port = free_port()
    top += f'allow_clients = ["{ip}/32"]\ntunnel_ports = [443, {service.port}, {port}]\n'
    return start_with(factory, up, certs, top=top, port=port, args=("--listen", f"0.0.0.0:{port}"))


def test_private_destinations_are_refused_to_non_loopback_clients(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs, service: Listener, outside_ip: str
) -> None:
    p = open_proxy(proxy_factory, upstream, certs, outside_ip, service)
    sp = service.port
    refused = [
        f"127.0.0.1:{sp}",
        f"localhost:{sp}",  # a name: its resolved address is checked
        f"[::ffff:127.0.0.1]:{sp}",
        f"0.0.0.0:{sp}",
        f"{outside_ip}:{sp}",  # this host's own address
        "169.254.169.254:443",  # cloud metadata; refused before any connect
        "[fe80::1]:443",
        "2130706433:443",  # decimal 127.0.0.1
        "0x7f.1:443",
    ]
    for target in refused:
        head, body = connect(p.port, target, source=outside_ip, dest=outside_ip)
        assert head.startswith(b"HTTP/1.1 403"), (target, head)
        one_line_reason(body)
    assert service.accepted == 0
    assert refused_count(p) == len(refused)
    # Plain http:// to the same places is refused too.
    with socket.create_connection((outside_ip, p.port), timeout=30, source_address=(outside_ip, 0)) as s:
        s.sendall(f"GET http://127.0.0.1:{sp}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_head(s).startswith(b"HTTP/1.1 403")
    assert service.accepted == 0
    # A public name (mapped by the operator's upstream.resolve, which is trusted) still tunnels.
    head, _ = connect(p.port, "other.example:443", source=outside_ip, dest=outside_ip)
    assert head.startswith(b"HTTP/1.1 200"), head
    # A loopback client of the same proxy may reach loopback services on tunnel_ports (by name: an IP
    # literal is refused without allow_ip_connect).
    with socket.create_connection(("127.0.0.1", p.port), timeout=30) as s:
        s.sendall(f"CONNECT localhost:{sp} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_head(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
    wait_for(lambda: service.accepted == 1, 10, "the loopback client's tunnel")
    no_tracebacks(p)


def test_allow_private_destinations_opens_them(
    proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs, service: Listener, outside_ip: str
) -> None:
    p = open_proxy(
        proxy_factory, upstream, certs, outside_ip, service, top="allow_private_destinations = true\n"
    )
    with socket.create_connection((outside_ip, p.port), timeout=30, source_address=(outside_ip, 0)) as s:
        s.sendall(f"CONNECT localhost:{service.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_head(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"ping")
        assert s.recv(4) == b"ping"
    # ... but never the proxy itself.
    for target in (f"127.0.0.1:{p.port}", f"{outside_ip}:{p.port}"):
        head, body = connect(p.port, target, source=outside_ip, dest=outside_ip)
        assert head.startswith(b"HTTP/1.1 403"), head
        assert "this proxy" in one_line_reason(body)
