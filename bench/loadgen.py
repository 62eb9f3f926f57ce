"""A keep-alive HTTP(S) load generator in its own process (the fallback when ``hey`` is not installed).

``python bench/loadgen.py URL --concurrency C --duration S [--proxy URL] [--cafile F] [--header H]``
prints one JSON line: requests, errors, rps, p50, p99 (seconds). Through a proxy an https URL goes via
CONNECT; each of the C workers keeps its connection alive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import time

import aiohttp


async def run(
    url: str,
    concurrency: int,
    duration: float,
    proxy: str | None,
    cafile: str | None,
    headers: dict[str, str],
) -> dict:
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    conn = aiohttp.TCPConnector(limit=concurrency, ssl=ctx, force_close=False)
    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as session:
        deadline = time.monotonic() + duration

        async def worker() -> None:
            nonlocal errors
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    async with session.get(url, proxy=proxy, headers=headers) as r:
                        await r.read()
                        if r.status not in (200, 206):
                            errors += 1
                            continue
                except (aiohttp.ClientError, OSError):
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t0)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * p / 100))] if lat else float("nan")

    return {"requests": len(lat), "errors": errors, "rps": len(lat) / elapsed, "p50": pct(50), "p99": pct(99)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--proxy")
    p.add_argument("--cafile")
    p.add_argument("--header", action="append", default=[], help="NAME: VALUE (repeatable)")
    a = p.parse_args()
    headers = dict(h.split(": ", 1) for h in a.header)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(run(a.url, a.concurrency, a.duration, a.proxy, a.cafile, headers))))


if __name__ == "__main__":
    main()
