"""The answers of the fake upstream's logged routes (tests/support/fakeupstream.py, whose docstring lists
them), and the state they share with its control routes. ``route`` picks the answer of a path.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import socket
import struct
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

RAW_ROUTES = ("/status/", "/closedelim/", "/cutmid/", "/hang", "/badframing")
Handler = Callable[[web.Request, "State"], Awaitable[web.StreamResponse]]


@dataclass
class State:
    """What one server remembers between requests: /__control sets it, {"reset": true} clears it."""

    files_dir: Path | None
    log_file: TextIO | None
    arrivals: list[dict[str, Any]] = field(default_factory=list)
    throttles: dict[str, dict[str, Any]] = field(default_factory=dict)
    # host -> (served per second at most, served times)
    capacity: dict[str, tuple[int, list[float]]] = field(default_factory=dict)
    robots: dict[str, str] = field(default_factory=dict)
    # /cc-index/table/ file answers: delay, in flight now, peak
    table: dict[str, Any] = field(default_factory=lambda: {"delay": 0.0, "now": 0, "max": 0})
    cdx_delay: float = 0.0  # seconds each CDX answer waits before its head (/__control "cdx_delay")


def _host(request: web.Request) -> str:
    return request.host.split(":")[0]


def _raw_query(request: web.Request, name: str) -> bytes | None:
    """The percent-decoded bytes of one query value, undecoded as text: any byte an upstream might send."""
    raw = request.raw_path.partition("?")[2]
    for part in raw.split("&"):
        k, _, v = part.partition("=")
        if urllib.parse.unquote(k) == name:
            return urllib.parse.unquote_to_bytes(v.replace("+", " ")).replace(b"\r", b"").replace(b"\n", b"")
    return None


async def _flush(transport: asyncio.BaseTransport) -> None:
    """Wait until the transport's buffer left the process, so a following cut does not drop it."""
    deadline = time.monotonic() + 10
    while transport.get_write_buffer_size() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)  # let the peer read it before the reset (an RST may discard unread data)


def _reset(transport: asyncio.BaseTransport) -> None:
    """A TCP reset: SO_LINGER 0, then close without any TLS goodbye."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


async def raw_answer(request: web.Request) -> web.StreamResponse:
    """Routes whose answer aiohttp would refuse to write: bytes go straight to the transport.

    The handler still returns a response object; aiohttp's write of it then fails on the closed transport,
    which aiohttp treats as a client that went away (no log line).
    """
    path, tr = request.path, request.transport
    assert tr is not None
    if path == "/hang":
        while not tr.is_closing():
            await asyncio.sleep(0.05)
        return web.Response()
    if request.method != "HEAD":
        async for _ in request.content.iter_chunked(65536):
            pass
    if path.startswith("/status/"):
        code = int(path[len("/status/") :])
        await asyncio.sleep(float(request.query.get("delay", "0")))
        ra = _raw_query(request, "retry_after")
        body = f"status {code}\n".encode()
        head = f"HTTP/1.1 {code} X\r\nContent-Length: {len(body)}\r\nContent-Type: text/plain\r\n".encode()
        head += b"Connection: close\r\n"
        if ra is not None:
            head += b"Retry-After: " + ra + b"\r\n"
        tr.write(head + b"\r\n" + (body if request.method != "HEAD" else b""))
        request.protocol.force_close()  # the next write (aiohttp's) is refused; the connection then closes
        await _flush(tr)
        tr.close()
        return web.Response()
    if path.startswith("/closedelim/") or path.startswith("/cutmid/"):
        n = int(path.rsplit("/", 1)[1])
        cut = request.query.get("cut", "reset") if path.startswith("/closedelim/") else "reset"
        framing = b"" if path.startswith("/closedelim/") else f"Content-Length: {n}\r\n".encode()
        send = n if path.startswith("/closedelim/") else n // 2
        tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n" + framing + b"\r\n")
        block = b"x" * 65536
        while send > 0:
            tr.write(block[: min(send, len(block))])
            send -= len(block)
            if tr.get_write_buffer_size() > 1 << 20:  # type: ignore[attr-defined]
                await _flush(tr)
        await _flush(tr)
        if cut == "none":
            tr.close()
        elif cut == "noclose_notify":
            tr.abort()
        else:
            _reset(tr)
        return web.Response()
    kind = request.query.get("kind", "cl")
    if kind == "chunk":
        tr.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz!\r\nxx\r\n0\r\n\r\n")
    else:
        tr.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello..")
    await _flush(tr)
    tr.close()
    return web.Response()


async def _robots(request: web.Request, state: State) -> web.StreamResponse:
    host = _host(request)
    if host in state.robots:
        return web.Response(text=state.robots[host])
    return web.Response(status=404, text="no robots\n")


async def _size(request: web.Request, state: State) -> web.StreamResponse:
    n = int(request.path[len("/size/") :])
    chunked = request.query.get("chunked") == "1"
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    if chunked:
        resp.enable_chunked_encoding()
    else:
        resp.content_length = n
    await resp.prepare(request)
    if request.method != "HEAD":
        block = b"x" * 65536
        while n > 0:
            await resp.write(block[: min(n, len(block))])
            n -= len(block)
    await resp.write_eof()
    return resp


async def _echo(request: web.Request, state: State) -> web.StreamResponse:
    h = hashlib.sha256()
    size = 0
    async for chunk in request.content.iter_chunked(65536):
        h.update(chunk)
        size += len(chunk)
    return web.json_response(
        {
            "method": request.method,
            "path": request.path_qs,
            "host": request.host,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body_length": size,
            "sha256": h.hexdigest(),
        }
    )


async def _raw(request: web.Request, state: State) -> web.StreamResponse:
    return await raw_answer(request)


async def _gzip(request: web.Request, state: State) -> web.StreamResponse:
    body = gzip.compress(b"hello gzip " * 100)
    return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})


async def _slow(request: web.Request, state: State) -> web.StreamResponse:
    await asyncio.sleep(float(request.query.get("delay", "5")))
    return web.Response(text="slow\n")


async def _collinfo(request: web.Request, state: State) -> web.StreamResponse:
    host = _host(request)
    crawls = [f"CC-MAIN-{2000 + i // 4}-{10 + i % 4 * 10}" for i in range(100)]
    return web.json_response(
        [
            {
                "id": c,
                "name": c,
                "timegate": f"https://{host}/{c}/",
                "cdx-api": f"https://{host}/{c}-index",
            }
            for c in reversed(crawls)
        ]
    )


async def _cdx_index(request: web.Request, state: State) -> web.StreamResponse:
    """pywb's CDX API: the answer streamed (chunked, no Content-Length), its captures named after the
    url= domain; a domain starting "empty." gets pywb's empty 200 of a failed backend ("blank.": one of
    whitespace only), one starting "nocaptures." its "No Captures found" 404."""
    if state.cdx_delay:
        await asyncio.sleep(state.cdx_delay)
    if request.query.get("showNumPages") == "true":
        return web.json_response({"pages": 1, "pageSize": 5, "blocks": 1})
    if int(request.query.get("page", "0") or 0) >= 1:
        return web.json_response({"error": "no more pages"}, status=400)
    crawl = request.path[1 : -len("-index")]
    domain = request.query.get("url", "example.com").split("/", 1)[0].lstrip("*.") or "example.com"
    if domain.startswith(("empty.", "blank.")):  # blank.: whitespace only, streamed
        return web.Response(
            status=200, body=b"" if domain[0] == "e" else b"\n \n\t\n", content_type="text/x-ndjson"
        )
    if domain.startswith("nocaptures."):
        return web.Response(status=404, text=f"No Captures found for: {domain}\n", content_type="text/plain")
    n = min(int(request.query.get("limit", "3") or 3), 3)
    host_key = ",".join(reversed(domain.split(".")))
    lines = [
        json.dumps(
            {
                "urlkey": f"{host_key})/page{i}",
                "timestamp": f"2024022{i}120000",
                "url": f"https://{domain}/page{i}",
                "mime": "text/html",
                "status": "200",
                "digest": f"DIGEST{i}",
                "length": str(1000 + i),
                "offset": str(5000 * i),
                "filename": f"crawl-data/{crawl}/segments/1/warc/CC-MAIN-{i}.warc.gz",
            }
        )
        for i in range(n)
    ]
    resp = web.StreamResponse(headers={"Content-Type": "text/x-ndjson"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    for line in lines:
        await resp.write((line + "\n").encode())
    await resp.write_eof()
    return resp


async def _file(request: web.Request, state: State) -> web.StreamResponse:
    path, table = request.path, state.table
    assert state.files_dir is not None
    f = state.files_dir / path.rsplit("/", 1)[-1]
    if not f.is_file():
        return web.Response(status=404, text="no such file\n")
    if not path.startswith("/cc-index/table/"):
        return web.FileResponse(f)
    table["now"] += 1
    table["max"] = max(table["max"], table["now"])
    try:  # counted in flight from arrival until the (small, local) answer is handed to aiohttp
        if table["delay"]:
            await asyncio.sleep(table["delay"])
        return web.FileResponse(f)
    finally:
        table["now"] -= 1


async def _hello(request: web.Request, state: State) -> web.StreamResponse:
    if request.path == "/" and request.query.get("list-type") == "2" and state.files_dir is not None:
        return _listing(request.query.get("prefix", ""), state.files_dir)
    return web.Response(text=f"hello from {_host(request)}{request.path_qs}\n")


def _listing(prefix: str, files_dir: Path) -> web.Response:
    """S3's ListObjectsV2 of ``files/DIR/``: the files named ``DIR-*`` (``_file`` serves a key by its last
    part), one page, as the AWS CLI's ``s3 cp --recursive`` reads it."""
    folder = prefix.removeprefix("files/").rstrip("/")
    names = sorted(f.name for f in files_dir.glob(f"{folder}-*") if f.is_file()) if folder else []
    items = "".join(
        f"<Contents><Key>files/{folder}/{n}</Key><Size>{(files_dir / n).stat().st_size}</Size>"
        "<LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;x&quot;</ETag>"
        "<StorageClass>STANDARD</StorageClass></Contents>"
        for n in names
    )
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>commoncrawl</Name>'
        f"<Prefix>{prefix}</Prefix><KeyCount>{len(names)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>false</IsTruncated>{items}</ListBucketResult>"
    )
    return web.Response(text=body, content_type="application/xml")


EXACT_ROUTES: dict[str, Handler] = {
    "/robots.txt": _robots,
    "/echo": _echo,
    "/gzip": _gzip,
    "/slow": _slow,
    "/collinfo.json": _collinfo,
}


def route(path: str, files_dir: Path | None) -> Handler:
    """The handler of a logged path: an exact route, else the first path family that matches, else hello.

    No exact path starts with a family's prefix, so this is the order of the single if-chain it replaced.
    """
    if path in EXACT_ROUTES:
        return EXACT_ROUTES[path]
    if path.startswith("/size/"):
        return _size
    if path.startswith(RAW_ROUTES):
        return _raw
    if path.startswith("/CC-MAIN-") and path.endswith("-index"):
        return _cdx_index
    if files_dir and path.startswith(("/cc-index/table/", "/files/")):
        return _file
    return _hello
