"""Accuracy of the global schedule, measured from the fake upstream's arrival log at a 20 ms gap.

Clients are real processes using the environment ``politeproxy env`` prints (tests.support.pacing_clients).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.measure import budget_bound
from tests.support.pacing_clients import Stats, arrival_stats, read_lock, run_clients, warm_upstream_pool
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

# Marked in the file, as every slow test is: `pytest -m "not slow"` skips it.
pytestmark = pytest.mark.slow

GAP = 0.02
RATE = 1 / GAP
PACED_20MS = NO_ROBOTS + '[schedule]\nglobal_rate = "20ms"\n'


def paced_arrivals(up: Upstream, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    return [a for a in up.log() if pred(a)]


def report(name: str, st: Stats, times: Sequence[float] = ()) -> None:
    # Shown with -s or on failure; the README and the issue quote these numbers.
    ts = sorted(times)
    gaps = sorted(((b - a, i) for i, (a, b) in enumerate(zip(ts, ts[1:], strict=False))), reverse=True)
    widest = " ".join(f"#{i}:{g * 1000:.0f}ms" for g, i in gaps[:4])
    print(
        f"\n{name}: n={st.n} rate={st.rate:.2f}/s ratio={st.rate / RATE:.4f} "
        f"max_1s_window={st.max_window} span={st.duration:.3f}s widest gaps {widest}",
        file=sys.stderr,
    )


# A granted request may reach the fake upstream's log this late: the proxies and the upstream are processes
# on a 2-core box beside make test's other workers, and one descheduled for a few tens of ms delivers (or
# logs) a request late, so the next second's window holds it too. 40 ms (53 a second) was exceeded once in
# a clean-clone run (54); 0.1 s, as test_workers' budget check, is 56.
LATE = 0.1


def check(st: Stats, n: int) -> None:
    """The budget's side strictly (at most 2 % over the rate; in any 1 s window the budget plus LATE's
    grants); the other side loosely: a busy box (make test-repeat's burner) stalls a client or the proxy now
    and then (a 110 ms gap once, 48.0/s over 2.5 s; gaps of 286 and 200 ms in one full run of the suite,
    39.9/s over 3 s), which makes the run slower, never faster. 0.7 still fails half the rate."""
    assert st.n == n
    assert st.rate / RATE - 1 <= 0.02, f"combined rate {st.rate:.2f}/s is over {RATE:g}/s by more than 2%"
    assert st.rate / RATE >= 0.7, f"combined rate {st.rate:.2f}/s is far under {RATE:g}/s"
    bound = budget_bound(RATE, 1.0, LATE)
    assert st.max_window <= bound, f"a 1 s window held {st.max_window} requests (bound {bound})"


def is_paced_size(a: dict[str, Any]) -> bool:
    return a["host"] == "data.commoncrawl.org" and a["path"].startswith("/size/")


def test_three_clients_through_one_proxy(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    p = proxy_factory(upstream, PACED_20MS)
    warm_upstream_pool(p.env)
    results = run_clients([p.env] * 3, "data.commoncrawl.org", 40, 8, "/size/64", tmp_path)
    assert [r["status"] for rs in results for r in rs].count(200) == 120
    arrivals = paced_arrivals(upstream, is_paced_size)
    st = arrival_stats([a["t"] for a in arrivals])
    report("3 clients x 40 via one proxy", st, [a["t"] for a in arrivals])
    check(st, 120)
    assert len({a["path"] for a in arrivals}) == 120  # each request once: nothing retried or duplicated
    assert read_lock(p.data_dir)[1] == 120


def test_three_proxies_sharing_one_data_dir(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    data_dir = tmp_path / "shared"
    proxies = [proxy_factory(upstream, PACED_20MS, data_dir=data_dir) for _ in range(3)]
    assert len({p.port for p in proxies}) == 3
    for p in proxies:
        warm_upstream_pool(p.env)
    results = run_clients([p.env for p in proxies], "data.commoncrawl.org", 40, 8, "/size/64", tmp_path)
    assert [r["status"] for rs in results for r in rs].count(200) == 120
    arrivals = paced_arrivals(upstream, is_paced_size)
    st = arrival_stats([a["t"] for a in arrivals])
    report("3 proxies x 40, one data dir", st, [a["t"] for a in arrivals])
    check(st, 120)
    # Every proxy's client got through, interleaved on the one schedule.
    pids = {a["path"].rsplit("pid=", 1)[1] for a in arrivals}
    assert len(pids) == 3
    nxt, count = read_lock(data_dir)
    assert count == 120
    assert nxt / 1e9 >= max(a["t"] for a in arrivals) - 0.5  # the record's next slot follows the last grant
    assert os.path.getsize(data_dir / "ratelimit.lock") == 16
