"""Small helpers the end-to-end tests share: a proxy started with an upstream table, raw sockets through
the proxy, TLS through a tunnel, pipelined reads, bad-input answers, /metrics samples and memory readings.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from tests.support.proxy_proc import FAST, ProxyProc
from tests.support.tlsclient import client_context
from tests.support.upstream_proc import Certs, Upstream, resolve_table

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


def blocks(total: int, block: int = 1 << 16) -> Iterator[bytes]:
    """``total`` bytes of a fixed pseudo-random pattern in ``block``-sized pieces (a streamed body)."""
    pattern = hashlib.sha256(b"seed").digest() * (block // 32)
    sent = 0
    while sent < total:
        chunk = pattern[: min(block, total - sent)]
        sent += len(chunk)
        yield chunk


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
    return client_context(cafile).wrap_socket(s, server_hostname=host)


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
    return p.metric(name, labels)


def host_labels(text: str) -> set[str]:
    """The ``host`` label values in a /metrics text."""
    return set(re.findall(r'host="([^"]*)"', text))


def proc_mem_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS"):
            out[k] = int(v.split()[0])
    return out


def raw(port: int, data: bytes, timeout: float = 30.0) -> tuple[bytes, bytes]:
    """Send ``data`` on a fresh connection; return the answer head and everything until the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        head = read_head(s)
        return head, read_to_close(s)


def read_to_close(s: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        out += b
    return out


def one_line_reason(body: bytes) -> str:
    text = body.decode()
    assert text.startswith("politeproxy: ") and text.endswith("\n") and text.count("\n") == 1, text
    return text


def no_tracebacks(p: ProxyProc) -> None:
    log = p.log()
    assert "Traceback" not in log, log
    assert " ERROR " not in log, log


# A reset, a TLS close without close_notify and a Content-Length body cut halfway are cuts; a clean close ends
# a close-delimited body whole (tests/e2e/test_fastnet_e2e.py runs the same cases on aiofastnet).
CUT_CASES = [
    ("/closedelim/300000?cut=reset", True),
    ("/closedelim/300000?cut=noclose_notify", True),
    ("/cutmid/300000", True),
    ("/closedelim/300000?cut=none", False),
]
