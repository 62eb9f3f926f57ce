"""Corrupt records in the file store (issue 9 items 3 and 12), under paced load.

``ratelimit.lock`` is shared with ccrawl and survives crashes and disks, so a proxy must read any 16 bytes:
0xFF everywhere (uint64 overflow), or a time hours ahead (a clock stepped back). The same goes for
``hosts/<host>``: 0xFF everywhere, a short file, and a well-formed record days in the future. Each is to be
treated as now and logged once: requests keep going at the rate (not 503 after max_wait), no traceback
flood, and a far-future record holds nobody. The lock is corrupted again mid-run, as ccrawl or a bad disk
could do to a running proxy.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.faults import (
    CC,
    DATA,
    INDEX,
    Checks,
    Load,
    arrivals_since,
    assert_budget,
    assert_clear,
    assert_no_request_during,
    log_counts,
    paced_toml,
    prefixes,
    status_counts,
    throttle,
    throttled_arrival,
)
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.faults]

NS = 1_000_000_000
HOST = struct.Struct(">QQQQQ")  # next_allowed, backoff_until, robots_expires (UnixNano), throttles, delay


def reached(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def lock_bytes(kind: str) -> bytes | None:
    if kind == "ff":
        return b"\xff" * 16
    if kind == "2h-ahead":  # the wall clock stepped back two hours after this record was written
        return struct.pack(">QQ", int((time.time() + 7200) * NS), 12345)
    return None


def corrupt_hosts(data_dir: Path) -> None:
    hosts = data_dir / "hosts"
    hosts.mkdir(parents=True, exist_ok=True)
    (hosts / DATA).write_bytes(b"\xff" * HOST.size)
    (hosts / CC).write_bytes(b"\xff" * 7)
    far = int((time.time() + 10 * 86400) * NS)  # ten days: far beyond backoff_cap (5 min)
    (hosts / INDEX).write_bytes(HOST.pack(far, far, 0, 3, 0))


@pytest.mark.parametrize("lock", ["intact", "ff", "2h-ahead"])
def test_corrupt_records_neither_stall_nor_flood(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path, lock: str
) -> None:
    data_dir = tmp_path / "dd"
    data_dir.mkdir()
    corrupt = lock_bytes(lock)
    if corrupt is not None:
        (data_dir / "ratelimit.lock").write_bytes(corrupt)
    corrupt_hosts(data_dir)
    p = proxy_factory(upstream, paced_toml(), data_dir=data_dir)
    upstream.reset()
    t_start = time.time()
    load = Load.start(tmp_path, [p.env], [prefixes("c", DATA, CC, INDEX)], concurrency=6)
    try:
        if not reached(lambda: len(arrivals_since(upstream, t_start)) >= 10, 12.0):
            n = len(arrivals_since(upstream, t_start))
            pytest.fail(f"paced requests stalled: {n} arrivals in 12 s; proxy log {log_counts(p)}")
        rewritten = time.time()
        if corrupt is not None:
            (data_dir / "ratelimit.lock").write_bytes(corrupt)  # again, under the running proxy
        t503 = throttled_arrival(upstream, CC, throttle(upstream, CC, "2"))
        time.sleep(3.0)  # the 2 s Retry-After, then 1 s more of every host (and the drain in finish())
        rs = load.finish()
    finally:
        load.kill()
    arrivals = arrivals_since(upstream, t_start)
    check = Checks()
    most = check(assert_budget, arrivals, {"start": t_start, "rewrite": rewritten, "503": t503})
    check(assert_no_request_during, arrivals, CC, t503, 2.0, "a Retry-After after the corrupt record")
    check(assert_clear, rs)
    check.that(status_counts(rs)[503] <= 1, f"503s beyond the one throttled: {status_counts(rs)}")
    counts = log_counts(p)
    check.that(counts["traceback"] == 0, f"{counts['traceback']} tracebacks in the proxy log")
    # One line per corrupt record (and perhaps one for the mid-run corruption), not one per claim.
    check.that(counts["warning_or_error"] <= 8, f"{counts['warning_or_error']} WARNING/ERROR lines")
    # Loosely: every host went at about its share of the rate (~1.7/s each, ~6 s with the drain); none held.
    per_host = {h: sum(1 for a in arrivals if a["host"] == h) for h in (DATA, CC, INDEX)}
    check.that(all(n >= 3 for n in per_host.values()), f"a host was held: {per_host}")
    print(f"\ncorrupt lock={lock}: busiest 1 s {most}, per host {per_host}, log {counts}")
    check.done()
