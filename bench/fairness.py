"""Fair shares between pipelines (issue 11): wait p50/p99 per pipeline for a greedy/polite mix.

``.venv/bin/python bench/fairness.py --candidate /path/to/old/tree`` runs the same mix through this tree's
politeproxy ("after": start-time fair queuing between pipelines) and through the candidate tree ("before",
e.g. a worktree of the commit before pipelines: one FIFO line per host), one after the other in one run:

* ``greedy``: one pipeline sends ``--greedy`` requests at once (a bulk job that queues everything);
* ``polite``: ``--polite`` requests, one every ``--every`` seconds, starting 1 s later (a lookup job).

Each request is a plain-HTTP GET through the proxy whose URL names its pipeline
(``http://greedy@127.0.0.1:PORT``); its wait is the time from send to answer, measured by the client (the
upstream answers at once, so this is the proxy's hold plus ~1 ms). The table gives p50/p99 of that wait per
pipeline and the refusals (503). Without ``--candidate`` only "after" is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    Bench,
    log,
    machine_note,
    make_certs,
    percentile,
    start_politeproxy,
    start_upstream,
    table,
)


async def _get(s: aiohttp.ClientSession, port: int, who: str, i: int) -> tuple[str, float, int]:
    t0 = time.monotonic()
    try:
        async with s.get(f"http://{DATA_HOST}/{who}/{i}", proxy=f"http://{who}@127.0.0.1:{port}") as r:
            await r.read()
            status = r.status
    except aiohttp.ClientError:
        status = 0
    return who, time.monotonic() - t0, status


async def mix(port: int, greedy: int, polite: int, every: float) -> list[tuple[str, float, int]]:
    """The greedy pipeline's requests all at once, the polite one's spaced, both to one paced host."""
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
        await _get(s, port, "warm", 0)  # the proxy's upstream connection is open before the mix
        flood = [asyncio.ensure_future(_get(s, port, "greedy", i)) for i in range(greedy)]
        await asyncio.sleep(1.0)
        spaced = []
        for i in range(polite):
            spaced.append(asyncio.ensure_future(_get(s, port, "polite", i)))
            await asyncio.sleep(every)
        return list(await asyncio.gather(*flood, *spaced))


def summarize(name: str, results: list[tuple[str, float, int]]) -> list[list[str]]:
    rows = []
    for who in ("greedy", "polite"):
        waits = [w for p, w, st in results if p == who and st == 200]
        refused = sum(1 for p, _w, st in results if p == who and st != 200)
        rows.append(
            [
                name,
                who,
                str(len(waits)),
                f"{percentile(waits, 50):.2f}",
                f"{percentile(waits, 99):.2f}",
                str(refused),
            ]
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", type=Path, help="the 'before' source tree (FIFO: before pipelines)")
    ap.add_argument("--gap", type=float, default=0.1, help="global seconds between grants (default 0.1)")
    ap.add_argument("--greedy", type=int, default=80)
    ap.add_argument("--polite", type=int, default=10)
    ap.add_argument("--every", type=float, default=0.5)
    args = ap.parse_args()
    extra = f'[schedule]\nbackend = "memory"\nglobal_rate = "{args.gap}s"\n'
    rows: list[list[str]] = []
    with Bench() as bench:
        certs = make_certs(bench.tmp)
        up = start_upstream(bench, certs)
        trees: list[tuple[str, Path | None]] = [("after (fair)", None)]
        if args.candidate:
            trees.insert(0, ("before (FIFO)", args.candidate.resolve()))
        for name, src in trees:
            proxy = start_politeproxy(bench, up, extra, name=name, src=src)
            log(f"{name}: {args.greedy} greedy at once, {args.polite} polite every {args.every}s")
            rows += summarize(name, asyncio.run(mix(proxy.port, args.greedy, args.polite, args.every)))
            proxy.proc.terminate()
            proxy.proc.wait(10)
    print(f"\nGreedy/polite mix, gap {args.gap:g} s ({1 / args.gap:g} req/s), memory store. {machine_note()}")
    print(table(["tree", "pipeline", "answered", "wait p50 s", "wait p99 s", "refused"], rows))


if __name__ == "__main__":
    main()
