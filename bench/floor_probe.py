"""The floor of issue 15: what the least Python asyncio proxy that terminates TLS on both legs costs here.

The floor probe is a minimal intercepting forward proxy on uvloop, in its own process: read a ``CONNECT``
head, answer 200, ``loop.start_tls(server_side=True)`` with the fake upstream's leaf for
data.commoncrawl.org, parse each request with httptools (llhttp), forward it over a pooled keep-alive
verified-TLS connection to the fake upstream, parse the answer with httptools and relay head and body to
the client in one write. No pacing, logs, metrics or store; GET-only, Content-Length bodies: an upper
bound on what any proxy of this shape can do, not a proxy.

``.venv/bin/python bench/floor_probe.py [--rounds 3] [--duration 4] [--conc 1,16,64]`` starts the fake
upstream, the floor probe and politeproxy (pacing, cache and exempt ceiling off, as bench/small_gets.py's
mode off) and drives each with ``hey`` (keep-alive HTTPS through the proxy) in rotated rounds. Per
concurrency: req/s median (range), the per-round ratio to direct, each proxy's CPU µs per 200 answer
(utime+stime from /proc) and how busy both cores were (/proc/stat).

``--held N`` (default 2000 when given bare) instead opens N TLS clients through the floor probe, each
sending one GET the probe holds (a future per request, no forwarding) and reports the probe's RSS idle and
at the peak: KiB per held request. Needs ``.venv/bin/pip install httptools``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import ssl
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import httptools
except ImportError:
    print("floor_probe: httptools is missing; install it with `.venv/bin/pip install httptools`")
    sys.exit(2)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.common import DATA_HOST, PY, Bench, log, make_certs, rss_mib, table  # noqa: E402
from bench.cpu_per_request import cpu_seconds  # noqa: E402
from bench.small_gets import run_hey  # noqa: E402
from bench.stats import cpu_jiffies, spread  # noqa: E402
from bench.two_processes import busy_share  # noqa: E402
from tests.conftest import wait_for  # noqa: E402

HELD: list[asyncio.Future[None]] = []


def raise_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)


# -- the floor probe (the --serve process) --------------------------------------------------------------


class Pool:
    """Keep-alive TLS connections to the upstream, at most ``cap``; callers wait in FIFO order."""

    def __init__(self, port: int, ctx: ssl.SSLContext, cap: int = 64) -> None:
        self.port, self.ctx, self.cap, self.n = port, ctx, cap, 0
        self.idle: list[UpConn] = []
        self.waiting: deque[Callable[[UpConn], None]] = deque()

    def acquire(self, cb: Callable[[UpConn], None]) -> None:
        if self.idle:
            cb(self.idle.pop())
        elif self.n < self.cap:
            self.n += 1
            asyncio.get_running_loop().create_task(self._open(cb))
        else:
            self.waiting.append(cb)

    async def _open(self, cb: Callable[[UpConn], None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(
                lambda: UpConn(self), "127.0.0.1", self.port, ssl=self.ctx, server_hostname=DATA_HOST
            )
        except OSError:
            self.n -= 1
            return
        cb(up)

    def release(self, up: UpConn) -> None:
        if self.waiting:
            self.waiting.popleft()(up)
        else:
            self.idle.append(up)

    def lost(self, up: UpConn) -> None:
        self.n -= 1
        if up in self.idle:
            self.idle.remove(up)


class UpConn(asyncio.Protocol):
    """One upstream connection: send a request head, parse the answer, relay it to the waiting client."""

    def __init__(self, pool: Pool) -> None:
        self.pool, self.parser = pool, httptools.HttpResponseParser(self)
        self.client: ClientConn | None = None
        self.reason, self.head, self.body = b"", [], []  # type: tuple[bytes, list[bytes], list[bytes]]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.lost(self)
        if self.client is not None:
            self.client.transport.close()

    def send(self, client: ClientConn, req: bytes) -> None:
        self.client = client
        self.transport.write(req)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.append(b"%s: %s\r\n" % (name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        msg = b"HTTP/1.1 %d %s\r\n%s\r\n%s" % (status, self.reason, b"".join(self.head), b"".join(self.body))
        client, self.client, self.head, self.body = self.client, None, [], []
        if client is not None and not client.transport.is_closing():
            client.transport.write(msg)
        if self.parser.should_keep_alive():
            self.pool.release(self)
        else:
            self.transport.close()


class ClientConn(asyncio.Protocol):
    """A client connection: a CONNECT head in plain text (or /__held, /__release), then HTTPS requests."""

    def __init__(self, pool: Pool, ctx: ssl.SSLContext) -> None:
        self.pool, self.ctx, self.tls = pool, ctx, False
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.head = b"", []  # type: tuple[bytes, list[bytes]]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # CONNECT: answer, then terminate TLS on this connection
            self.transport.pause_reading()
            self.transport.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            asyncio.get_running_loop().create_task(self._upgrade())
        except httptools.HttpParserError:
            self.transport.close()

    async def _upgrade(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(self.transport, self, self.ctx, server_side=True)
        except (OSError, ssl.SSLError):
            self.transport.close()
            return
        assert tls is not None
        self.transport, self.tls, self.url = tls, True, b""
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.append(b"%s: %s\r\n" % (name, value))

    def on_message_complete(self) -> None:
        url, head, self.url, self.head = self.url, self.head, b"", []
        if not self.tls:
            return self._control(url) if self.parser.get_method() != b"CONNECT" else None
        req = b"GET %s HTTP/1.1\r\n%s\r\n" % (url, b"".join(head))
        if url.startswith(b"/hold/"):  # the floor of a held request: a future and what it will send
            fut = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda _f: self.pool.acquire(lambda up: up.send(self, req[:4] + req[9:])))
            HELD.append(fut)
            return None
        self.pool.acquire(lambda up: up.send(self, req))
        return None

    def _control(self, url: bytes) -> None:
        if url == b"/__release":
            for fut in HELD:
                fut.set_result(None)
            HELD.clear()
        body = b"%d" % len(HELD)
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
            len(body), body))  # fmt: skip
        self.transport.close()


async def serve(a: argparse.Namespace) -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    server_ctx.set_alpn_protocols(["http/1.1"])
    server_ctx.load_cert_chain(a.cert)
    pool = Pool(a.upstream_port, ssl.create_default_context(cafile=a.ca))
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: ClientConn(pool, server_ctx), "127.0.0.1", 0, backlog=4096)
    await asyncio.to_thread(Path(a.port_file).write_text, str(srv.sockets[0].getsockname()[1]))
    await asyncio.sleep(a.lifetime)  # bounded: the probe stops by itself


# -- the driver -----------------------------------------------------------------------------------------


def start_floor(b: Bench, up: Any, certs: Any, lifetime: float) -> tuple[int, int]:
    """The floor probe in its own process: (pid, port)."""
    pf = b.tmp / f"floor-port-{time.monotonic_ns()}"
    cmd = [PY, str(Path(__file__).resolve()), "--serve", "--port-file", str(pf), "--upstream-port",
           str(up.port), "--ca", str(certs.ca_file), "--cert", str(certs.server_pem),
           "--lifetime", str(lifetime)]  # fmt: skip
    proc = b.spawn(cmd, "floor.log")
    wait_for(lambda: pf.exists() and pf.read_text() != "" or proc.poll() is not None, 30, "floor probe")
    if proc.poll() is not None:
        raise RuntimeError(f"floor probe exited: {(b.tmp / 'floor.log').read_text()}")
    return proc.pid, int(pf.read_text())


Sample = dict[str, list[float]]
Path3 = tuple[str, str | None, int | None]  # name, proxy URL, proxy pid


def measure_paths(a: argparse.Namespace, paths: list[Path3], url: str, direct: str) -> dict[int, Sample]:
    """Interleaved rounds; per concurrency and path: req/s, CPU µs/request and the machine's busy share."""
    got: dict[int, Sample] = {c: {} for c in a.conc}
    for _name, px, _pid in paths:  # warm-up: leaves, pools, connections
        for c in a.conc:
            run_hey(direct if px is None else url, px, c, 1.0, [])
    for r in range(a.rounds):
        for c in a.conc:
            for name, px, pid in paths[r % len(paths) :] + paths[: r % len(paths)]:
                c0, j0 = cpu_seconds(pid) if pid else 0.0, cpu_jiffies()
                run = run_hey(direct if px is None else url, px, c, a.duration, [])
                rps, us = run.rps, 1e6 * (cpu_seconds(pid) - c0) / max(run.ok, 1) if pid else float("nan")
                busy, s = busy_share(j0, cpu_jiffies()), got[c]
                s.setdefault(f"{name} rps", []).append(rps)
                s.setdefault(f"{name} us", []).append(us)
                s.setdefault(f"{name} busy", []).append(busy)
                log(f"round {r + 1} c={c} {name}: {rps:.0f} req/s, {us:.0f} µs/req, {busy:.0%} busy")
    return got


def report(a: argparse.Namespace, got: dict[int, Sample], names: list[str]) -> str:
    rows = []
    for c in a.conc:
        s = got[c]
        for n in names:
            vs = [x / y for x, y in zip(s[f"{n} rps"], s["direct rps"], strict=True)]
            us = s[f"{n} us"]
            vf = [x / y for x, y in zip(us, s["floor us"], strict=True)] if n != "direct" else []
            rows.append([c, n, spread(s[f"{n} rps"]), spread(vs, 2) if n != "direct" else "",
                         spread(us) if n != "direct" else "", spread(vf, 2) if vf else "",
                         f"{statistics.median(s[f'{n} busy']):.0%}"])  # fmt: skip
    head = ["conc", "path", "req/s median (range)", "vs direct, per round", "proxy CPU µs/req",
            "CPU vs floor, per round", "both cores busy"]  # fmt: skip
    return (f"Small GETs (/size/1024), hey keep-alive, {a.rounds} rounds x {a.duration:g} s, "
            f"interleaved\n\n" + table(head, rows))  # fmt: skip


def throughput(a: argparse.Namespace) -> str:
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = common.start_upstream(b, certs)
        fpid, fport = start_floor(b, up, certs, a.rounds * len(a.conc) * 3 * (a.duration + 3) + 120)
        pp = common.start_politeproxy(b, up, common.PACING_OFF)
        floor = f"http://127.0.0.1:{fport}"
        paths = [("direct", None, None), ("floor", floor, fpid), ("politeproxy", pp.url, pp.pid)]
        direct = f"https://127.0.0.1:{up.port}/size/1024"
        got = measure_paths(a, paths, f"https://{DATA_HOST}/size/1024", direct)
    return report(a, got, [n for n, _, _ in paths])


async def ctl(port: int, path: str) -> int:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    n = int((await r.read()).split(b"\r\n\r\n", 1)[1])
    w.close()
    return n


async def one_client(port: int, ctx: ssl.SSLContext, path: bytes, sem: asyncio.Semaphore) -> str:
    """CONNECT, TLS, one GET; the answer's status (or the error's name)."""
    try:
        async with sem:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % ((DATA_HOST.encode(),) * 2))
            await r.readuntil(b"\r\n\r\n")
            await w.start_tls(ctx, server_hostname=DATA_HOST)
            w.write(b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, DATA_HOST.encode()))
        head = await r.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        await r.readexactly(int(length.group(1)) if length else 0)
        w.close()
        return head.split(b" ", 2)[1].decode()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError) as e:
        return type(e).__name__


async def hold(a: argparse.Namespace, port: int, pid: int, ca: Path) -> list[list[object]]:
    ctx = ssl.create_default_context(cafile=str(ca))
    sem = asyncio.Semaphore(200)
    assert await one_client(port, ctx, b"/size/100", sem) == "200"  # warm: leaf context, upstream pool
    await asyncio.sleep(1.0)
    idle, t0 = rss_mib(pid), time.monotonic()
    tasks = [asyncio.ensure_future(one_client(port, ctx, b"/hold/size/100", sem)) for _ in range(a.held)]
    held, last, since = 0, -1, time.monotonic()
    while held < a.held and time.monotonic() - since < 20:  # stop when all held or no progress for 20 s
        await asyncio.sleep(0.25)
        held = await ctl(port, "/__held")
        last, since = (held, time.monotonic()) if held != last else (last, since)
    peak, t_peak = rss_mib(pid), time.monotonic() - t0
    await ctl(port, "/__release")
    answers: dict[str, int] = {}
    for st in await asyncio.wait_for(asyncio.gather(*tasks), 120):
        answers[st] = answers.get(st, 0) + 1
    got = ", ".join(f"{k}: {v}" for k, v in sorted(answers.items()))
    per = (peak - idle) * 1024 / held if held else float("nan")
    log(f"held {held} after {t_peak:.1f} s: RSS {idle:.1f} -> {peak:.1f} MiB, {per:.1f} KiB per held request")
    return [["held requests (asked)", f"{held:,} ({a.held:,})"], ["seconds to the peak", f"{t_peak:.1f}"],
            ["floor RSS idle MiB", f"{idle:.1f}"], ["floor RSS at the peak MiB", f"{peak:.1f}"],
            ["floor VmHWM MiB", f"{common.hwm_mib(pid):.1f}"], ["KiB per held request", f"{per:.1f}"],
            ["answers after release", got]]  # fmt: skip


def held_mode(a: argparse.Namespace) -> str:
    import uvloop

    raise_nofile()
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = common.start_upstream(b, certs)
        pid, port = start_floor(b, up, certs, 600)
        rows = uvloop.run(asyncio.wait_for(hold(a, port, pid, certs.ca_file), 480))
    return f"Floor probe holding {a.held:,} HTTPS requests (one process of clients)\n\n" + table(
        ["measure", "value"], rows)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--conc", default="1,16,64")
    p.add_argument("--held", type=int, nargs="?", const=2000, default=0, help="held-memory mode, N clients")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    for k in ("--port-file", "--ca", "--cert"):
        p.add_argument(k, help=argparse.SUPPRESS)
    p.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lifetime", type=float, default=600.0, help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.duration, a.conc, a.held = 1, 0.5, "1,4", min(a.held, 20)
    a.conc = [int(x) for x in a.conc.split(",")]
    if a.serve:
        import uvloop

        raise_nofile()
        uvloop.run(serve(a))
        return
    text = held_mode(a) if a.held else throughput(a)
    print(f"Machine: {common.machine_note()}\n\n{text}")


if __name__ == "__main__":
    main()
