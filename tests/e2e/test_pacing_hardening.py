"""Issue 9 items 9 and 21 of the pacer end to end, through a real proxy: 500 host names leave a bounded set
of metric label series, and a full queue answers 503 with Retry-After at once. The in-process cases are in
tests/unit/pacing/test_pacer_bounds.py."""

from __future__ import annotations

import asyncio
import http.client
import re
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from politeproxy.observe.metricparts import FREE_HOST_LABELS, PINNED_HOSTS
from politeproxy.pacing import pacer as pacer_mod
from politeproxy.policy.hosts import HostSet
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import host_labels
from tests.support.upstream_proc import Upstream

A = "data.commoncrawl.org"

# -- item 9 end to end: 500 names through a real proxy, then its /metrics -----------------------------------


@pytest.mark.slow
def test_500_names_through_a_proxy_keep_metrics_series_bounded(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    names = [f"n{i}.commoncrawl.org" for i in range(500)]
    # Bare keys right after the fixture's [upstream.resolve] table: every name reaches the fake upstream.
    mapped = "".join(f'"{h}:443" = "127.0.0.1:{upstream.port}"\n' for h in names)
    # No transparent retries: each name is one failed request (the retries' backoffs cost ~4 s of 13).
    pacing = "[pacing]\nretries = 0\n"
    proxy = proxy_factory(upstream, mapped + NO_ROBOTS + '[schedule]\nglobal_rate = "1ms"\n' + pacing)
    # One client context for all 500 (CONNECT, then TLS verified against the proxy's bundle): a client that
    # loads the bundle again for each name (requests does) spends ~50 ms of CPU a name in this process.
    ctx = ssl.create_default_context(cafile=str(proxy.data_dir / "ca-bundle.pem"))

    def one(host: str) -> int:
        c = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=ctx, timeout=30)
        try:
            c.set_tunnel(host, 443)
            c.request("GET", "/x")
            return c.getresponse().status
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            c.close()

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(one, names))
    # The fake upstream's certificate does not name them: each went through the pacer, then failed upstream.
    assert sum(s in (200, 502, 503, 504) for s in statuses) >= 450, statuses[:20]
    labels = host_labels(proxy.metrics())
    # Pinned: the two always shown plus the configured concrete hosts (their series exist from the start).
    pinned = set(PINNED_HOSTS) | set(HostSet().concrete_hosts())
    assert len(labels) <= len(pinned) + FREE_HOST_LABELS + 1, len(labels)
    assert "other" in labels


# -- item 21 end to end: a full queue answers 503 + Retry-After at once --------------------------------------


async def _ask(port: int, path: str, answers: list[bytes], conns: list[asyncio.StreamWriter]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conns.append(writer)
    writer.write(f"GET http://{A}{path} HTTP/1.1\r\nHost: {A}\r\n\r\n".encode())
    await writer.drain()
    answers.append(await reader.readuntil(b"\r\n\r\n"))


@pytest.mark.slow  # 1100 client connections and the wait for their refusals
async def test_a_full_queue_answers_503_with_retry_after_at_once(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    cap = pacer_mod.DEFAULT_MAX_QUEUE if hasattr(pacer_mod, "DEFAULT_MAX_QUEUE") else 1024
    # Pacing off, no retries by the proxy, and a host told to back off for 30 s: only the cap bounds its line.
    proxy = proxy_factory(
        upstream,
        NO_ROBOTS + '[schedule]\nglobal_rate = "0s"\n[pacing]\nretries = 0\nmax_wait = "60s"\n',
    )
    upstream.control({"throttle": {"host": A, "count": 1, "status": 503, "retry_after": "30"}})
    first: list[bytes] = []
    conns: list[asyncio.StreamWriter] = []
    await _ask(proxy.port, "/first", first, conns)
    assert first[0].startswith(b"HTTP/1.1 503")
    answers: list[bytes] = []
    tasks = [asyncio.create_task(_ask(proxy.port, f"/q{i}", answers, conns)) for i in range(cap + 76)]
    # The refusals come as soon as the line is full; 1,100 connections take a moment to be accepted on a
    # loaded box, so wait for them (bounded, well inside the 30 s backoff the rest wait behind), then a
    # moment more: any answer beyond the 76 would show up in it.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15.0
    while len(answers) < 76 and loop.time() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    try:
        assert len(answers) == 76, answers[:3]
        for head in answers:
            assert head.startswith(b"HTTP/1.1 503") and b"\r\nRetry-After: 1\r\n" in head
        # Summed over the series: the metrics also hold zero series for the configured hosts.
        found = re.findall(
            r'politeproxy_rejected_total\{host="[^"]+",pipeline="[^"]+",reason="queue_full"\} (\S+)',
            proxy.metrics(),
        )
        assert found and sum(map(float, found)) == 76, found
        assert sum(e["path"].startswith("/q") for e in upstream.log()) == 0  # nothing went upstream
    finally:
        for t in tasks:
            t.cancel()
        for w in conns:
            w.close()
        await asyncio.gather(*tasks, return_exceptions=True)
