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
  /CC-MAIN-*-index        a pywb-style CDX answer, streamed (chunked): JSON lines named after the url=
                          domain (limit= honoured, at most 3), showNumPages, 400 for page >= 1 (pywb's "no
                          more pages"); url=empty.* an empty 200 (blank.*: whitespace only), url=nocaptures.*
                          "No Captures found" 404
  /__log                  the arrival log as JSON lines (not logged itself)
  /__control (POST JSON)  {"throttle": {"host": H, "count": N, "status": 503, "retry_after": "2"}}, with
                          optional "headers": {...} (Server: AmazonS3 ...) and "body": "..." for the answer,
                          and "forms": true to refuse only what CloudFront refuses by its form (a method
                          other than GET or HEAD, or a request body), as CloudFront's own 403 does
                          or {"robots": {"host": H, "text": "..."}}, {"reset": true} (a fresh server's state)
                          or {"table_delay": S}: each /cc-index/table/ file answer waits S seconds first
                          or {"cdx_delay": S}: each CDX answer waits S seconds before its head
                          or {"capacity": {"host": H, "per_second": N}}: H answers 503 SlowDown (no
                          Retry-After) to a request when it already served N in the last second (a storm)
  /__inflight             JSON {"now": N, "max": M}: /cc-index/table/ file answers in flight, now and at most
                          (since the last table_delay control; not logged itself)
The three control routes live here; every other path is logged, may be refused (a throttle, a capacity), and
is then answered by tests/support/fakeupstream_routes.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.fakeupstream_routes import Handler, State, route

LOG_KEY = web.AppKey("log", list)


def _over_capacity(per_second: int, served: list[float], now: float) -> bool:
    """A host that served ``per_second`` requests in the last second refuses this one; else it counts it."""
    while served and served[0] <= now - 1.0:
        served.pop(0)
    if len(served) >= per_second:
        return True
    served.append(now)
    return False


async def _inflight(request: web.Request, state: State) -> web.StreamResponse:
    return web.json_response({"now": state.table["now"], "max": state.table["max"]})


async def _log(request: web.Request, state: State) -> web.StreamResponse:
    return web.Response(text="".join(json.dumps(a) + "\n" for a in state.arrivals))


async def _control(request: web.Request, state: State) -> web.StreamResponse:
    cmd = await request.json()
    table = state.table
    if cmd.get("reset"):  # back to a fresh server's state (tests share one server per module)
        state.arrivals.clear()
        state.throttles.clear()
        state.robots.clear()
        state.capacity.clear()
        table["delay"], table["max"] = 0.0, table["now"]
        state.cdx_delay = 0.0
    if "throttle" in cmd:
        t = cmd["throttle"]
        state.throttles[t["host"]] = dict(t)
    if "capacity" in cmd:
        c = cmd["capacity"]
        state.capacity[c["host"]] = (int(c["per_second"]), [])
    if "table_delay" in cmd:
        table["delay"] = float(cmd["table_delay"])
        table["max"] = table["now"]
    if "cdx_delay" in cmd:
        state.cdx_delay = float(cmd["cdx_delay"])
    if "robots" in cmd:
        state.robots[cmd["robots"]["host"]] = cmd["robots"]["text"]
    return web.json_response({"ok": True})


CONTROL_ROUTES: dict[str, Handler] = {"/__inflight": _inflight, "/__log": _log, "/__control": _control}


def _log_arrival(request: web.Request, host: str, state: State) -> dict[str, Any]:
    entry = {
        "t": time.time(),
        "host": host,
        "method": request.method,
        "path": request.path_qs,
        "range": request.headers.get("Range"),
    }
    state.arrivals.append(entry)
    if state.log_file:
        state.log_file.write(json.dumps(entry) + "\n")
    return entry


def _refusal(path: str, host: str, now: float, state: State, odd: bool) -> web.Response | None:
    """A throttled (/__control "throttle") or over-capacity host's answer; /robots.txt is never refused.
    ``odd``: a form CloudFront refuses by itself (a throttle with "forms" takes only those)."""
    if path == "/robots.txt":
        return None
    t = state.throttles.get(host)
    if t and t.get("count", 0) > 0 and (odd or not t.get("forms")):
        t["count"] -= 1
        headers = {"Retry-After": str(t["retry_after"])} if t.get("retry_after") is not None else {}
        headers.update({"Content-Type": "text/plain"} | dict(t.get("headers") or {}))
        body = str(t.get("body", "slow down\n")).encode()
        return web.Response(status=int(t.get("status", 503)), body=body, headers=headers)
    if host in state.capacity and _over_capacity(*state.capacity[host], now):
        return web.Response(status=503, text="SlowDown\n")
    return None


def make_app(files_dir: Path | None, log_path: Path | None) -> web.Application:
    """One server's app: the control routes, else log the arrival, refuse it or answer it (``route``)."""
    app = web.Application()
    log_file = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115
    state = State(files_dir, log_file)

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        host = request.host.split(":")[0]
        if path in CONTROL_ROUTES:  # the tests' own routes: not logged, never refused
            return await CONTROL_ROUTES[path](request, state)
        entry = _log_arrival(request, host, state)
        odd = request.method not in ("GET", "HEAD") or request.body_exists
        refusal = _refusal(path, host, entry["t"], state, odd)
        if refusal is not None:
            return refusal
        return await route(path, files_dir)(request, state)

    app.router.add_route("*", "/{tail:.*}", handle)
    app[LOG_KEY] = state.arrivals
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
