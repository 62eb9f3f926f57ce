"""The exempt ceiling end to end (issue 12), counted from the fake upstream's arrival log: range reads of
the parquet index from two proxies sharing one store (a data dir, or one Redis) stay within the GCRA
ceiling: no 1 s window holds more than rate + burst + 2 (delivery jitter), and the whole run stays within
rate x time + burst. A block holds exempt reads too."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
RATE = 0.05  # exempt.rate: 20 reads/s per service
BURST = 5
TABLE = "/cc-index/table/cc-main/warc/part-0.parquet"


def config(extra: str = "") -> str:
    return (
        NO_ROBOTS
        + f'[exempt]\nrate = "{RATE}s"\nburst = {BURST}\nmax_in_flight = 16\n'
        + '[pacing]\nblock_hold = "2s"\nadaptive = false\n'
        + "[cache]\nenabled = false\n"  # the scans repeat ranges: the ceiling is measured, not the cache
        + extra
    )


redis_server = redis_fixture(scope="module")


def scan(envs: list[dict[str, str]], seconds: float, threads: int = 6) -> list[int]:
    """``threads`` range readers per proxy, each reading without pause for ``seconds``."""
    stop = time.monotonic() + seconds
    statuses: list[int] = []

    def reader(env: dict[str, str], n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            statuses.append(tunnel_get(env, DATA, f"{TABLE}?r={n}-{i}", {"Range": f"bytes={i}-{i + 9}"})[0])
            i += 1

    with ThreadPoolExecutor(threads * len(envs)) as ex:
        futs = [ex.submit(reader, env, k * threads + j) for k, env in enumerate(envs) for j in range(threads)]
        for f in futs:
            f.result(120)
    return statuses


def table_arrivals(up: Upstream) -> list[float]:
    return sorted(a["t"] for a in up.log() if a["path"].startswith(TABLE))


def assert_within_ceiling(ts: list[float]) -> None:
    assert len(ts) > 2 * BURST, len(ts)
    per_window = max(sum(t <= u < t + 1.0 for u in ts) for t in ts)
    # The upstream counts arrivals: a read granted just before a window and delivered late lands in it.
    # Jitter tolerated: 0.1 s of delivery lateness, two slots at 20/s (12 readers and two proxies on a
    # loaded 2-core box: one clean-clone run counted 27). The whole run's bound below stays exact.
    assert per_window <= 1 / RATE + BURST + 2, per_window
    # The GCRA grants at most BURST + span / RATE slots over a span; the arrival log measures the span with
    # the upstream leg's jitter (a first arrival delivered late shortens it): the same 0.1 s of lateness as
    # above, two slots (one slot over was seen in a run beside a CPU burner).
    span = ts[-1] - ts[0]
    assert len(ts) <= (span + RATE) / RATE + BURST + 2, (len(ts), span)
    assert len(ts) >= 0.6 * span / RATE, (len(ts), span)  # loosely: the ceiling, not the readers, set it


@pytest.mark.slow
def test_two_proxies_on_one_data_dir_share_the_exempt_ceiling(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    a = proxy_factory(upstream, config(), data_dir=shared)
    b = proxy_factory(upstream, config(), data_dir=shared)
    scan([a.env, b.env], 10.0)
    assert_within_ceiling(table_arrivals(upstream))


@pytest.mark.slow
def test_two_proxies_on_one_redis_share_the_exempt_ceiling(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, redis_server: RedisServer
) -> None:
    prefix = f"pp-exempt-{uuid.uuid4().hex[:8]}:"
    top = f'[schedule]\nbackend = "redis"\nredis_url = "{redis_server.url}"\nredis_prefix = "{prefix}"\n'
    a = proxy_factory(upstream, config(top))
    b = proxy_factory(upstream, config(top))
    scan([a.env, b.env], 10.0)
    assert_within_ceiling(table_arrivals(upstream))


@pytest.mark.slow  # a 2 s block hold, then 3.5 s of scans
def test_a_block_stops_exempt_reads_too(proxy_factory: Callable[..., ProxyProc], upstream: Upstream) -> None:
    p = proxy_factory(upstream, config())
    upstream.control({"throttle": {"host": DATA, "count": 1, "status": 403, "retry_after": None}})
    assert tunnel_get(p.env, DATA, "/size/1?paced")[0] == 403
    t403 = max(a["t"] for a in upstream.log() if a["path"] == "/size/1?paced")
    statuses = scan([p.env], 3.5, threads=3)
    ts = table_arrivals(upstream)
    assert ts and min(ts) >= t403 + 2.0 - 0.05, [round(t - t403, 3) for t in ts[:3]]
    assert 200 in statuses or 206 in statuses or 404 in statuses
