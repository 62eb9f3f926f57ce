"""Rate measurements over an upstream arrival log (shared by the accuracy tests)."""

from __future__ import annotations

import bisect
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


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
        [sys.executable, "-m", "tests.loadclient", "--n", str(n), "--concurrency", str(concurrency), prefix],
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
