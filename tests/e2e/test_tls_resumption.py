"""Issue 15, TLS session resumption towards clients: a client that keeps its TLS session (curl, duckdb's
httpfs, Python's ssl with ``session=``) resumes it on its next tunnel to the same host, skipping the full
handshake with its leaf signature (on the default transports, as the suite runs them)."""

from __future__ import annotations

import socket
import ssl

from tests.support.proxy_proc import ProxyProc

HOST = "data.commoncrawl.org"


def _tunnel(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, f"proxy closed the CONNECT: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head
    return s


def _get(ctx: ssl.SSLContext, port: int, session: ssl.SSLSession | None) -> ssl.SSLSocket:
    """One GET through a fresh tunnel; the answer read whole, so TLS 1.3 tickets have arrived."""
    tls = ctx.wrap_socket(_tunnel(port), server_hostname=HOST, session=session)
    tls.sendall(f"GET /size/10 HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := tls.recv(65536):
        data += chunk
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"x" * 10), data[:200]
    return tls


def test_a_client_resumes_its_tls_session_on_the_next_tunnel(shared_fast_proxy: ProxyProc) -> None:
    ctx = ssl.create_default_context(cafile=str(shared_fast_proxy.data_dir / "ca-bundle.pem"))
    first = _get(ctx, shared_fast_proxy.port, None)
    assert not first.session_reused
    session = first.session
    first.close()
    assert session is not None and session.has_ticket, "the proxy issued no session ticket"
    second = _get(ctx, shared_fast_proxy.port, session)
    try:
        assert second.session_reused, "the second tunnel did a full handshake"
    finally:
        second.close()
