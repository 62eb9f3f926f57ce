"""Rate measurements over an upstream arrival log (shared by the accuracy tests)."""

from __future__ import annotations

import bisect
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def achieved_rate(times: Sequence[float]) -> float:
    """Requests per second between the first and the last arrival: (n - 1) / span."""
    ts = sorted(times)
    if len(ts) < 2 or ts[-1] == ts[0]:
        return float("inf")
    return (len(ts) - 1) / (ts[-1] - ts[0])


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The most arrivals any sliding window of ``window`` seconds holds."""
    ts = sorted(times)
    best = 0
    for i, t in enumerate(ts):
        j = bisect.bisect_left(ts, t + window)
        best = max(best, j - i)
    return best


# The budget rule every rate test uses (docs/testing.md, "Writing a timing test that does not flake"). On the
# schedule a window of W seconds holds at most floor(W * rate) + 1 grants (both ends can land on a slot).
# The schedule is kept, not re-spaced from the send time, so a grant delivered L seconds late (a busy event
# loop, a starved process) can be followed by the next one on time: it adds at most ceil(L * rate) arrivals
# to some window. A test names the lateness it tolerates (``late``, seconds); one grant late by under a gap
# is ``late = 1 / rate``.
def budget_bound(rate: float, window: float, late: float) -> int:
    """The most arrivals a ``window`` may hold at ``rate``/s when grants may arrive up to ``late`` s late."""
    return math.floor(window * rate + 1e-9) + 1 + math.ceil(late * rate - 1e-9)


def over_budget(times: Sequence[float], rate: float, window: float, late: float) -> str | None:
    """None if every sliding ``window`` holds at most ``budget_bound``; else what the busiest one held."""
    bound = budget_bound(rate, window, late)
    start, count = busiest_window(times, window)
    if count <= bound:
        return None
    return (
        f"{count} arrivals in the {window:g} s from {start:.3f}; the bound is {bound} "
        f"({rate:g}/s over {window:g} s, plus {late:g} s of late grants)"
    )


def busiest_window(times: Sequence[float], window: float = 1.0) -> tuple[float, int]:
    """The start and the count of the busiest sliding window, for failure messages."""
    ts = sorted(times)
    best = (ts[0] if ts else 0.0, 0)
    for i, t in enumerate(ts):
        j = bisect.bisect_left(ts, t + window)
        if j - i > best[1]:
            best = (t, j - i)
    return best


def run_clients(env: dict[str, str], prefix: str, n: int, concurrency: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.loadclient",
            "--n",
            str(n),
            "--concurrency",
            str(concurrency),
            prefix,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def results(proc: subprocess.Popen[str], timeout: float = 120) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def requests_during(
    arrivals: Sequence[dict[str, Any]], host: str, start: float, end: float
) -> list[dict[str, Any]]:
    """The arrivals at ``host`` strictly inside (start, end): requests sent during a backoff, for one."""
    return [a for a in arrivals if a["host"] == host and start < a["t"] < end]


def budget_report(times: Sequence[float], rate: float, marks: dict[str, float] | None = None) -> str:
    """The busiest 1 s window against the budget, placed relative to named events (kill, restart, ...)."""
    start, count = busiest_window(times)
    where = ", ".join(f"{start - t:+.2f}s from {name}" for name, t in (marks or {}).items())
    return f"{count} arrivals in the 1 s from {start:.3f} ({where}); budget {rate:g}/s + 1"


def run_load(
    env: dict[str, str],
    prefixes: Sequence[str],
    concurrency: int,
    until: Path,
    n: int = 100_000,
    timeout: float = 40.0,
) -> subprocess.Popen[str]:
    """Paced load until the file ``until`` exists (loadclient --until); read it with results()."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.loadclient",
            "--n",
            str(n),
            "--concurrency",
            str(concurrency),
            "--timeout",
            str(timeout),
            "--until",
            str(until),
            *prefixes,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
