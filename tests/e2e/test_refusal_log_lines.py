"""A client that retries refusals at once writes few log lines (issue 41): per cause, host and pipeline, one
access line and one operator line per ``REFUSALS_EVERY`` (30 s), the refusals in between summed up on the
line that opens the next interval. The counting itself is tested on a fake clock
(tests/unit/observe/test_access_refusals.py); this is the real proxy, a real client and its log.

(In tests/e2e/test_client_answers.py until 2026-12-07: a file of its own runs beside that one's 30 s hold
on another worker.)
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from politeproxy.observe.logs import REFUSALS_EVERY
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import ProxyFactory, bundle, proxies, upstream_toml
from tests.support.upstream_proc import Certs, Upstream

pytestmark = pytest.mark.slow

# One interval and 3 s of the next: the line that opens the second interval, with the first one's sum, is
# written (its first refusal comes at most a request's time after 30 s), and the loop ends. 60 s until
# 2026-12-07, two intervals: the second only repeated the first, with its bounds twice as loose per second.
LOOP = REFUSALS_EVERY + 3.0
MOST_LINES = 5  # per LOOP: 2 expected; 10 in 60 s before, the same ratio to the time looped


@pytest.fixture
def looped(proxy_factory: ProxyFactory, upstream: Upstream, certs: Certs) -> ProxyProc:
    text = (
        NO_ROBOTS
        + '[schedule]\nbackend = "memory"\nglobal_rate = "1/h"\n[pacing]\nmax_wait = "1s"\n'
        + upstream_toml(upstream, certs)
    )
    p = proxy_factory(None, text)
    first = requests.get(
        "https://data.commoncrawl.org/echo?first", proxies=proxies(p), verify=str(bundle(p)), timeout=60
    )
    assert first.status_code == 200, first.text
    p.mark_log()
    return p


def test_a_client_retrying_refusals_in_a_tight_loop_adds_few_log_lines(looped: ProxyProc) -> None:
    """33 s of a client retrying every refusal at once: at most 5 access lines for that cause, one of
    which sums up the refusals it stands for."""
    n = 0
    deadline = time.monotonic() + LOOP
    with requests.Session() as s:
        kw: dict[str, Any] = {"proxies": proxies(looped), "verify": str(bundle(looped)), "timeout": 30}
        while time.monotonic() < deadline:
            assert s.get("https://data.commoncrawl.org/loop", **kw).status_code == 503
            n += 1
            # ~100 retries a second, not as fast as the box allows: still hundreds of refusals per summing
            # interval, without taking a core from the suite's timing tests for 33 s
            time.sleep(0.01)
    time.sleep(0.5)
    lines = [x for x in looped.log_since().splitlines() if "politeproxy.access" in x and "/loop " in x]
    assert n >= 200, n  # a tight loop: hundreds of refusals
    assert 1 <= len(lines) <= MOST_LINES, lines
    summed = sum(int(x.split(" repeated=")[1].split()[0]) for x in lines if " repeated=" in x)
    # the first interval's refusals are summed on the line that opens the next; the open one's are held
    assert len(lines) + summed <= n and summed >= n / 4, (n, lines)
    events = [x for x in looped.log_since().splitlines() if "refused 503" in x or "more refusals" in x]
    print(f"{n} refusals in {LOOP:g} s: {len(lines)} access lines ({summed} summed), {len(events)} events")
    assert len(events) <= MOST_LINES, events  # the operator's line: one per cause and pipeline per interval
