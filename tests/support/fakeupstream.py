"""A local TLS server impersonating Common Crawl's hosts, with an arrival log.

Run as ``python -m tests.support.fakeupstream --cert server.pem --port-file F [--log FILE]``; it writes its
port (and the plain HTTP port with ``--plain-port``) to ``--port-file`` once listening. Routes (any host):
  /size/N[?chunked=1]     N bytes of b"x" (Content-Length, or chunked)
  /echo                   JSON: method, path, host, headers, body length and sha256
  /status/CODE[?retry_after=V&delay=S]   answers after S seconds (default 0), with Connection: close;
                          V is sent as the raw bytes of its percent-decoding ("--5", "%C2%B2" for "²");
                          CR and LF are dropped so the head stays one head
  /closedelim/N[?cut=reset|noclose_notify|none]   HTTP/1.1 200 with neither Content-Length nor chunked
                          framing: N bytes of b"x", then a TCP reset (SO_LINGER 0; the default), a transport
                          abort (on TLS: no close_notify), or a clean close (close_notify, then FIN)
  /cutmid/N               Content-Length: N, but the connection is reset after N//2 bytes
  /hang                   reads the request and never answers, until the client goes away
  /badframing?kind=cl|chunk   cl: two conflicting Content-Length headers; chunk: an invalid chunk size
  /gzip                   a gzip-encoded body with Content-Encoding: gzip
  /robots.txt             404 unless /__control set robots text
  /slow?delay=S           answers after S seconds
  /cc-index/table/... and /files/NAME   a file from --files-dir, with Range support
  /collinfo.json          a Common Crawl collection list (100 crawls) whose cdx-api URLs name this host
  /CC-MAIN-*-index        a pywb-style CDX answer: JSON lines (limit= honoured, at most 3), showNumPages,
                          and 400 for page >= 1 (pywb's "no more pages")
  /__log                  the arrival log as JSON lines (not logged itself)
  /__control (POST JSON)  {"throttle": {"host": H, "count": N, "status": 503, "retry_after": "2"}}
                          or {"robots": {"host": H, "text": "..."}}, {"reset": true} (a fresh server's state)
                          or {"table_delay": S}: each /cc-index/table/ file answer waits S seconds first
                          or {"capacity": {"host": H, "per_second": N}}: H answers 503 SlowDown (no
                          Retry-After) to a request when it already served N in the last second (a storm)
  /__inflight             JSON {"now": N, "max": M}: /cc-index/table/ file answers in flight, now and at most
                          (since the last table_delay control; not logged itself)
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import os
import socket
import ssl
import struct
import time
import urllib.parse
from pathlib import Path
from typing import Any

from aiohttp import web

LOG_KEY = web.AppKey("log", list)
RAW_ROUTES = ("/status/", "/closedelim/", "/cutmid/", "/hang", "/badframing")


def _over_capacity(per_second: int, served: list[float], now: float) -> bool:
    """A host that served ``per_second`` requests in the last second refuses this one; else it counts it."""
    while served and served[0] <= now - 1.0:
        served.pop(0)
    if len(served) >= per_second:
        return True
    served.append(now)
    return False


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


def make_app(files_dir: Path | None, log_path: Path | None) -> web.Application:
    app = web.Application()
    arrivals: list[dict[str, Any]] = []
    throttles: dict[str, dict[str, Any]] = {}
    capacity: dict[str, tuple[int, list[float]]] = {}  # host -> (served per second at most, served times)
    robots: dict[str, str] = {}
    table = {"delay": 0.0, "now": 0, "max": 0}  # /cc-index/table/ file answers: delay, in flight now, peak
    log_file = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        host = request.host.split(":")[0]
        if path == "/__inflight":
            return web.json_response({"now": table["now"], "max": table["max"]})
        if path == "/__log":
            return web.Response(text="".join(json.dumps(a) + "\n" for a in arrivals))
        if path == "/__control":
            cmd = await request.json()
            if cmd.get("reset"):  # back to a fresh server's state (tests share one server per module)
                arrivals.clear()
                throttles.clear()
                robots.clear()
                capacity.clear()
                table["delay"], table["max"] = 0.0, table["now"]
            if "throttle" in cmd:
                t = cmd["throttle"]
                throttles[t["host"]] = dict(t)
            if "capacity" in cmd:
                c = cmd["capacity"]
                capacity[c["host"]] = (int(c["per_second"]), [])
            if "table_delay" in cmd:
                table["delay"] = float(cmd["table_delay"])
                table["max"] = table["now"]
            if "robots" in cmd:
                robots[cmd["robots"]["host"]] = cmd["robots"]["text"]
            return web.json_response({"ok": True})
        entry = {
            "t": time.time(),
            "host": host,
            "method": request.method,
            "path": request.path_qs,
            "range": request.headers.get("Range"),
        }
        arrivals.append(entry)
        if log_file:
            log_file.write(json.dumps(entry) + "\n")
        t = throttles.get(host)
        if t and t.get("count", 0) > 0 and path != "/robots.txt":
            t["count"] -= 1
            headers = {"Retry-After": str(t["retry_after"])} if t.get("retry_after") is not None else {}
            return web.Response(status=int(t.get("status", 503)), text="slow down\n", headers=headers)
        if host in capacity and path != "/robots.txt" and _over_capacity(*capacity[host], entry["t"]):
            return web.Response(status=503, text="SlowDown\n")
        if path == "/robots.txt":
            if host in robots:
                return web.Response(text=robots[host])
            return web.Response(status=404, text="no robots\n")
        if path.startswith("/size/"):
            n = int(path[len("/size/") :])
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
        if path == "/echo":
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
        if path.startswith(RAW_ROUTES):
            return await raw_answer(request)
        if path == "/gzip":
            body = gzip.compress(b"hello gzip " * 100)
            return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        if path == "/slow":
            await asyncio.sleep(float(request.query.get("delay", "5")))
            return web.Response(text="slow\n")
        if path == "/collinfo.json":
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
        if path.startswith("/CC-MAIN-") and path.endswith("-index"):
            if request.query.get("showNumPages") == "true":
                return web.json_response({"pages": 1, "pageSize": 5, "blocks": 1})
            if int(request.query.get("page", "0") or 0) >= 1:
                return web.json_response({"error": "no more pages"}, status=400)
            crawl = path[1 : -len("-index")]
            n = min(int(request.query.get("limit", "3") or 3), 3)
            lines = [
                json.dumps(
                    {
                        "urlkey": f"com,example)/page{i}",
                        "timestamp": f"2024022{i}120000",
                        "url": f"https://example.com/page{i}",
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
            return web.Response(text="".join(line + "\n" for line in lines), content_type="text/x-ndjson")
        if files_dir and (path.startswith("/cc-index/table/") or path.startswith("/files/")):
            name = path.rsplit("/", 1)[-1]
            f = files_dir / name
            if f.is_file():
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
            return web.Response(status=404, text="no such file\n")
        return web.Response(text=f"hello from {host}{request.path_qs}\n")

    app.router.add_route("*", "/{tail:.*}", handle)
    app[LOG_KEY] = arrivals
    return app


async def serve(args: argparse.Namespace) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert)
    app = make_app(Path(args.files_dir) if args.files_dir else None, Path(args.log) if args.log else None)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=ctx, backlog=4096)
    await site.start()
    ports = [runner.addresses[0][1]]
    if args.plain_port is not None:
        plain = web.TCPSite(runner, "127.0.0.1", args.plain_port, backlog=4096)
        await plain.start()
        ports.append(runner.addresses[1][1])
    tmp = args.port_file + ".tmp"
    Path(tmp).write_text(" ".join(map(str, ports)))  # noqa: ASYNC240 - once, at start-up
    os.replace(tmp, args.port_file)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--log")
    p.add_argument("--files-dir")
    p.add_argument("--plain-port", type=int, help="also serve plain HTTP on this port (0: any)")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args))
    except ImportError:
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
