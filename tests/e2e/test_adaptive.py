"""The adaptive host interval end to end (issue 12), counted from the fake upstream's arrival log: after a
503 the host resumes at no more than half the configured rate, and is back at it within
adaptive_recovery plus one step; with ``adaptive = false`` it resumes at once at the full rate."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.pacing_clients import tunnel_get
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
GAP = 0.1  # the configured rate: 10/s
RETRY_AFTER = 1.0
RECOVERY = 4.0  # adaptive_recovery: 4 steps of 1 s
STEP = RECOVERY / 4
FLOOR = 0.25  # the raised interval: max(floor, 2 x gap) = 0.25 s, 4/s: under half the configured rate


def config(adaptive: bool) -> str:
    return (
        NO_ROBOTS
        + f'[schedule]\nglobal_rate = "{GAP}s"\n'
        + f'[pacing]\nbackoff_jitter = 0.0\nadaptive = {str(adaptive).lower()}\nadaptive_floor = "{FLOOR}s"\n'
        + f'adaptive_recovery = "{RECOVERY}s"\n'
    )


def run_load(p: ProxyProc, up: Upstream, seconds: float) -> list[float]:
    """Eight clients asking without pause, so the schedule, never the demand, sets the rate; the first
    request is answered 503 Retry-After: 1."""
    up.control({"throttle": {"host": DATA, "count": 1, "status": 503, "retry_after": str(int(RETRY_AFTER))}})
    stop = time.monotonic() + seconds

    def client(n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            tunnel_get(p.env, DATA, f"/size/1?c={n}&i={i}")
            i += 1

    with ThreadPoolExecutor(8) as ex:
        for f in [ex.submit(client, n) for n in range(8)]:
            f.result(120)
    return sorted(a["t"] for a in up.log() if a["host"] == DATA)


def count(ts: list[float], start: float, end: float) -> int:
    return sum(start <= t < end for t in ts)


@pytest.mark.slow
def test_after_a_503_the_host_resumes_below_half_rate_and_recovers(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    p = proxy_factory(upstream, config(adaptive=True))
    ts = run_load(p, upstream, RETRY_AFTER + RECOVERY + STEP + 3.0)
    end = ts[0] + RETRY_AFTER  # the backoff ends
    # the first seconds after the backoff: at most half the configured rate (strict), one boundary arrival
    first = count(ts, end, end + 2.0)
    assert first <= 0.5 * 2.0 / GAP + 1, first
    # within adaptive_recovery + one step it is back at the configured rate (loosely: 70 %, never above)
    back = end + RECOVERY + STEP
    late = count(ts, back, back + 2.0)
    assert 0.7 * 2.0 / GAP <= late <= 2.0 / GAP + 1, late
    # and it stepped down in between: more in the last step than in the first, fewer than at full rate
    assert count(ts, end, end + STEP) < count(ts, end + 3 * STEP, end + 4 * STEP) <= STEP / GAP + 1


@pytest.mark.slow
def test_adaptive_off_resumes_at_the_full_rate(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream
) -> None:
    """The control: today's behaviour, so the test above measures the adaptive interval, not the load."""
    p = proxy_factory(upstream, config(adaptive=False))
    ts = run_load(p, upstream, RETRY_AFTER + 3.0)
    end = ts[0] + RETRY_AFTER
    assert count(ts, end, end + 2.0) >= 0.7 * 2.0 / GAP
