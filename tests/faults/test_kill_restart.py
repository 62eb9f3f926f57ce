"""kill -9 of a proxy under paced load, and its restart on the same data dir (file store).

A second proxy shares the data dir and keeps its own load going, so the restarted proxy has to fit into a
schedule that never paused. A Retry-After answered just before the kill must hold the host after the
restart: the record is in ``hosts/``, not only in the dead process's memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.faults import (
    CC,
    DATA,
    Checks,
    Load,
    arrivals_since,
    assert_budget,
    assert_clear,
    assert_no_request_during,
    paced_toml,
    prefixes,
    throttle,
    throttled_arrival,
    wait_arrivals,
)
from tests.support.processes import wait_for
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.faults]

RETRY_AFTER = 6.0


def throttle_recorded(p: ProxyProc, host: str) -> bool:
    return any(
        line.startswith("politeproxy_throttles_total") and f'host="{host}"' in line
        for line in p.metrics().splitlines()
    )


def test_kill_9_and_restart_under_paced_load(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    data_dir = tmp_path / "shared"
    toml = paced_toml()
    a = proxy_factory(upstream, toml, data_dir=data_dir)
    b = proxy_factory(upstream, toml, data_dir=data_dir)
    upstream.reset()
    t_start = time.time()
    # Only A sends to data.commoncrawl.org, so the throttle there is recorded by the proxy that gets killed.
    load = Load.start(tmp_path, [a.env, b.env], [prefixes("a", DATA, CC), prefixes("b", CC)])
    try:
        wait_arrivals(upstream, 10, t_start)
        t503 = throttled_arrival(upstream, DATA, throttle(upstream, DATA, f"{RETRY_AFTER:g}"))
        wait_for(lambda: throttle_recorded(a, DATA), 5, "proxy A to record the throttle")
        killed = time.time()
        a.kill()
        a2 = proxy_factory(upstream, toml, data_dir=data_dir, port=a.port)
        back = time.time()
        assert back < t503 + RETRY_AFTER, "the restart outlasted the Retry-After; the test proves nothing"
        # 1.5 s of load after the backoff, and ~1.6 s more as the eight queued requests drain in finish().
        wait_for(lambda: time.time() > t503 + RETRY_AFTER + 1.5, 30, "the load after the backoff")
        rs = load.finish()
    finally:
        load.kill()
    arrivals = arrivals_since(upstream, t_start)
    marks = {"kill": killed, "restart": back, "503": t503}
    check = Checks()
    most = check(assert_budget, arrivals, marks)
    what = "a Retry-After answered before kill -9"
    check(assert_no_request_during, arrivals, DATA, t503, RETRY_AFTER, what)
    # Clients of the killed proxy see failed connections while it is down, and nothing unclear otherwise.
    check(assert_clear, rs, down=[(killed - 0.1, back + 0.5)])
    # Loosely: the restarted proxy paced again, and data.commoncrawl.org flowed once the backoff ended.
    after = [x for x in arrivals if x["t"] > back and "/load/a-" in x["path"]]
    check.that(len(after) >= 5, f"only {len(after)} requests through the restarted proxy")
    check.that(any(x["host"] == DATA and x["t"] >= t503 + RETRY_AFTER for x in arrivals), "no data after")
    check.that(a2.healthy() and b.healthy(), "a proxy is not healthy at the end")
    print(f"\nkill -9: {len(arrivals)} arrivals, busiest 1 s window {most}, after restart {len(after)}")
    check.done()
