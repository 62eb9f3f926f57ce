"""Blocks end to end (issue 12), counted from the fake upstream's arrival log: a 403 holds the host for
block_hold, then exactly one probe goes alone, a 403 on the probe doubles the hold, the 403 is never retried,
two proxies on one store hold together and send one probe between them, and every 403/429/503 the client
sees carries a Retry-After.

Every request is /slow?delay=PROBE_ANSWER: a probe "goes alone" when nothing else arrives until its answer
is back (without the probe rule the others would follow one global gap later)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
HOLD = 2.0  # block_hold in these tests
PROBE_ANSWER = 0.6  # how long the upstream takes to answer each request
GAP = 0.1
CONFIG = (
    NO_ROBOTS
    + f'[schedule]\nglobal_rate = "{GAP}s"\n'
    + f'[pacing]\nbackoff_jitter = 0.0\nblock_hold = "{HOLD}s"\nblock_hold_cap = "8s"\n'
    + "adaptive = false\n"
)
SLACK = 0.05  # clock and scheduling jitter between the proxy and the upstream's log

Result = tuple[int, dict[str, str], str]


def throttle(up: Upstream, count: int, status: int = 403, retry_after: str | None = None) -> None:
    up.control({"throttle": {"host": DATA, "count": count, "status": status, "retry_after": retry_after}})


def arrivals(up: Upstream) -> list[float]:
    return sorted(a["t"] for a in up.log() if a["host"] == DATA and a["path"] != "/robots.txt")


def load(envs: list[dict[str, str]], seconds: float, threads: int = 3) -> list[Result]:
    """``threads`` clients per proxy, each sending one request after another for ``seconds``."""
    out: list[Result] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(env: dict[str, str], n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            path = f"/slow?delay={PROBE_ANSWER}&c={n}&i={i}"
            status, headers, _ = tunnel_get(env, DATA, path)
            with lock:
                out.append((status, headers, path))
            i += 1

    with ThreadPoolExecutor(threads * len(envs)) as ex:
        futs = [ex.submit(client, env, k * threads + j) for k, env in enumerate(envs) for j in range(threads)]
        for f in futs:
            f.result(120)
    return out


def assert_alone(ts: list[float], probe: float, what: str) -> None:
    """Nothing else reached the host while the probe's answer was on its way."""
    during = [round(t - probe, 3) for t in ts if probe < t < probe + PROBE_ANSWER - SLACK]
    assert not during, f"{what}: arrivals {during} s after the probe, before its answer"


def assert_retry_after(results: list[Result]) -> None:
    for status, headers, path in results:
        if status in (403, 429, 503):
            assert headers.get("retry-after", "").isdigit(), (status, headers, path)


@pytest.mark.slow  # block_hold of 2 s and more, then the probe
def test_a_403_holds_the_host_then_one_probe_goes_alone_then_traffic_resumes(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, CONFIG)
    throttle(upstream, 1)
    results = load([p.env], HOLD + 4.0)
    ts = arrivals(upstream)
    t403 = ts[0]
    # held: nothing during block_hold (one request already on its way may land within a gap)
    early = [round(t - t403, 3) for t in ts[1:] if t < t403 + HOLD - SLACK]
    assert all(d <= GAP + SLACK for d in early) and len(early) <= 1, early
    after = [t for t in ts if t >= t403 + HOLD - SLACK]
    assert after, "nothing after the hold"
    assert_alone(ts, after[0], "the probe")
    # then traffic resumes: more than the probe within the seconds after its answer
    assert len([t for t in after if t > after[0] + PROBE_ANSWER - SLACK]) >= 3, [t - t403 for t in after]
    # the 403 went back to its client with a Retry-After, and was never retried transparently
    blocked = [r for r in results if r[0] == 403]
    assert len(blocked) == 1 and blocked[0][1].get("retry-after") == str(int(HOLD)), blocked
    retried = [a for a in upstream.log() if a["path"] == blocked[0][2]]
    assert len(retried) == 1, retried
    assert_retry_after(results)


@pytest.mark.slow  # block_hold of 2 s and more, then the probe
def test_a_403_on_the_probe_doubles_the_hold(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, CONFIG)
    throttle(upstream, 2)
    results = load([p.env], 3 * HOLD + 3.0)
    ts = arrivals(upstream)
    t403 = ts[0]
    probe1 = next(t for t in ts if t >= t403 + HOLD - SLACK)
    assert_alone(ts, probe1, "the first probe")
    later = [t for t in ts if t > probe1]
    assert later and later[0] - probe1 >= 2 * HOLD - SLACK, [round(t - probe1, 3) for t in later[:3]]
    assert_alone(ts, later[0], "the second probe")
    blocked = [r for r in results if r[0] == 403]
    assert [r[1].get("retry-after") for r in blocked] == [str(int(HOLD)), str(int(2 * HOLD))], blocked
    assert_retry_after(results)


@pytest.mark.slow  # block_hold of 2 s and more, then the probe
def test_two_proxies_on_one_store_hold_together_and_send_one_probe(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    shared = tmp_path / "shared-data"
    a = proxy_factory(upstream, CONFIG, data_dir=shared)
    b = proxy_factory(upstream, CONFIG, data_dir=shared)
    throttle(upstream, 1)
    results = load([a.env, b.env], HOLD + 4.0, threads=2)
    ts = arrivals(upstream)
    t403 = ts[0]
    # each proxy may have had one slot reserved before the 403 was recorded: at most those, at once
    early = [round(t - t403, 3) for t in ts[1:] if t < t403 + HOLD - SLACK]
    assert len(early) <= 2 and all(d <= 2 * GAP + SLACK for d in early), early
    after = [t for t in ts if t >= t403 + HOLD - SLACK]
    assert_alone(ts, after[0], "the one probe of both proxies")
    assert len([t for t in after if t > after[0] + PROBE_ANSWER - SLACK]) >= 3
    assert_retry_after(results)


@pytest.mark.slow  # sleeps out each Retry-After it is given
def test_every_throttle_answer_carries_retry_after(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """403, 429 and 503 passed on without a Retry-After get one (the pacer's delay); the proxy's own 503
    (a wait beyond max_wait during a block) has one too, and its body says the host is blocked until when."""
    p = proxy_factory(
        upstream,
        CONFIG.replace("adaptive = false\n", 'adaptive = false\nretries = 0\nmax_wait = "1s"\n'),
    )
    seen: list[Result] = []
    for status in (429, 503, 403):
        throttle(upstream, 1, status)
        code, headers, body = tunnel_get(p.env, DATA, f"/size/1?s={status}")
        seen.append((code, headers, body.decode()))
        assert code == status and headers.get("retry-after", "").isdigit(), (status, headers)
        if status != 403:
            time.sleep(float(headers["retry-after"]) + 0.1)
    code, headers, body = tunnel_get(p.env, DATA, "/size/1?held")
    assert code == 503 and headers.get("retry-after", "").isdigit(), (code, headers)
    assert f"{DATA} is blocked until " in body.decode(), body
    assert all(a["path"] != "/size/1?held" for a in upstream.log())
