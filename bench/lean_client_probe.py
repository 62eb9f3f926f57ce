"""What a lean upstream client could save: client-side CPU per small GET, aiohttp's ClientSession against a
minimal keep-alive HTTP/1.1 client on an asyncio protocol with h11 (the sans-io parser the proxy already
uses), both over verified TLS to the fake upstream, in one process, interleaved rounds.

``.venv/bin/python bench/lean_client_probe.py [-n 3000] [--rounds 4]`` prints process CPU µs per request of
each client (the fake upstream runs in its own process, so only the client's work is counted). The probe
client is GET-only with Content-Length bodies: an upper bound on what the lever can give, not a client.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import h11

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA_HOST, Bench, make_certs, start_upstream  # noqa: E402
from bench.stats import spread  # noqa: E402
from politeproxy.proxy.origin.upstream import client_ssl_context  # noqa: E402


class H11Conn(asyncio.Protocol):
    """One keep-alive connection: send a request head, collect the answer's events until EndOfMessage."""

    def __init__(self) -> None:
        self.conn = h11.Connection(h11.CLIENT)
        self.done: asyncio.Future[tuple[int, bytes]] | None = None
        self.status = 0
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        while True:
            ev = self.conn.next_event()
            if ev is h11.NEED_DATA:
                return
            if isinstance(ev, h11.Response):
                self.status = ev.status_code
            elif isinstance(ev, h11.Data):
                self.body.append(ev.data)
            elif isinstance(ev, h11.EndOfMessage):
                assert self.done is not None
                self.done.set_result((self.status, b"".join(self.body)))
                self.conn.start_next_cycle()
                return

    async def get(self, path: str) -> tuple[int, bytes]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.body = []
        req = h11.Request(method="GET", target=path, headers=[("Host", DATA_HOST)])
        self.transport.write(self.conn.send(req) + self.conn.send(h11.EndOfMessage()))
        return await self.done


async def measure(port: int, ca: str, n: int, rounds: int) -> None:
    ctx = client_ssl_context(ca)
    url = f"https://{DATA_HOST}:{port}/size/1024"
    resolver = aiohttp.resolver.ThreadedResolver()
    conn = aiohttp.TCPConnector(ssl=ctx, resolver=resolver)
    session = aiohttp.ClientSession(connector=conn, auto_decompress=False)
    loop = asyncio.get_running_loop()
    _tr, proto = await loop.create_connection(H11Conn, "127.0.0.1", port, ssl=ctx, server_hostname=DATA_HOST)

    async def via_aiohttp() -> None:
        async with session.get(url.replace(DATA_HOST, "127.0.0.1"), headers={"Host": DATA_HOST}, ssl=ctx,
                               server_hostname=DATA_HOST) as r:  # fmt: skip
            await r.read()

    async def via_h11() -> None:
        status, body = await proto.get("/size/1024")
        assert status == 200 and len(body) == 1024

    out: dict[str, list[float]] = {"aiohttp": [], "h11": []}
    for r in range(rounds):
        order = [("aiohttp", via_aiohttp), ("h11", via_h11)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            await fn()
            c0 = time.process_time()
            for _ in range(n):
                await fn()
            out[name].append(1e6 * (time.process_time() - c0) / n)
    await session.close()
    for name, v in out.items():
        print(f"{name}: {spread(v)} µs/request, rounds {v}")
    ratios = [h / a for h, a in zip(out["h11"], out["aiohttp"], strict=True)]
    print(f"h11/aiohttp: {spread(ratios, 2)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    with Bench() as b:
        up = start_upstream(b, make_certs(b.tmp))
        import uvloop

        uvloop.run(measure(up.port, str(up.ca_file), a.n, a.rounds))


if __name__ == "__main__":
    main()
