"""Many processes, one schedule: separate interpreters claiming from one Redis get slots exactly one gap
apart, also when their clocks disagree (the server's time decides)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from politeproxy.stores.redis_store import RedisStore
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6


CLAIMER = r"""
import asyncio, json, sys, time
url, prefix, n, gap, skew, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), float(sys.argv[6])
from politeproxy.stores.redis_store import RedisStore
real = time.time
while real() < start:  # a common start line, so the processes contend rather than take turns
    time.sleep(0.002)
if skew:
    time.time = lambda: real() + skew  # this machine's clock is off; the schedule must not care
async def main():
    store = RedisStore(url, prefix=prefix)
    out = []
    for _ in range(n):
        c, server_at = await store.claim_with_server_time("data.commoncrawl.org", gap, 0.0, None)
        out.append({"granted": c.granted, "wait": c.wait, "at": c.at, "server_at": server_at})
        await asyncio.sleep(c.wait)
    await store.close()
    print(json.dumps(out))
asyncio.run(main())
"""


def run_claimers(url: str, prefix: str, n: int, gap: float, skews: list[float]) -> list[list[dict[str, Any]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.time() + 1.0  # room for the interpreters to start and import
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, url, prefix, str(n), str(gap), str(skew), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        for skew in skews
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode(errors="replace")
        results.append(json.loads(out))
    return results


def assert_spaced(slots: list[float], gap: float) -> None:
    slots = sorted(slots)
    gaps = [b - a for a, b in zip(slots, slots[1:], strict=False)]
    assert min(gaps) >= gap - EPS, min(gaps)


@pytest.mark.slow  # three interpreters per case and server kind, started together (many processes)
async def test_three_processes_share_one_exact_schedule(shared_redis: RedisServer, prefix: str) -> None:
    results = await asyncio.to_thread(run_claimers, shared_redis.url, prefix, 40, 0.02, [0.0, 0.0, 0.0])
    claims = [c for r in results for c in r]
    assert len(claims) == 120 and all(c["granted"] for c in claims)
    assert_spaced([c["server_at"] for c in claims], 0.02)
    # The processes really contended: at some point each had to wait behind the others.
    assert all(max(c["wait"] for c in r) > 0.02 for r in results)
    s = RedisStore(shared_redis.url, prefix=prefix)
    try:
        assert await s.grants() == 120
    finally:
        await s.close()


@pytest.mark.slow  # several interpreters per case and server kind (many processes)
async def test_skewed_clocks_share_the_server_schedule(shared_redis: RedisServer, prefix: str) -> None:
    results = await asyncio.to_thread(run_claimers, shared_redis.url, prefix, 20, 0.02, [0.0, 5.0])
    claims = [c for r in results for c in r]
    assert len(claims) == 40 and all(c["granted"] for c in claims)
    assert_spaced([c["server_at"] for c in claims], 0.02)
    # Had the schedule used the skewed local clock, the other process would wait ~5 s for a slot.
    assert max(c["wait"] for c in claims) < 0.5
    # ``at`` is in each process's own clock: the skewed one is 5 s ahead of the server, the other not.
    straight, skewed = results
    assert all(abs(c["at"] - c["server_at"]) < 0.5 for c in straight)
    assert all(abs(c["at"] - c["server_at"] - 5.0) < 0.5 for c in skewed)
