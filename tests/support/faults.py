"""Shared pieces of the fault suite: one paced configuration, load that survives a dying proxy, and the three
checks every fault test makes from the fake upstream's arrival log (the budget, the backoffs, the statuses).

The budget is 5 req/s (a 200 ms gap): at 100 ms, the arrival jitter of a loaded 2-core box alone (gaps of
18-158 ms measured for a 100 ms schedule, with seven test runs sharing the cores) put a twelfth arrival in a
window; at 200 ms a double grant (two slots ms apart) still shows at once. The upper bound (rate + 1 per
sliding 1 s window) is strict; lower bounds are loose.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.measure import (
    budget_report,
    busiest_window,
    max_in_window,
    over_budget,
    requests_during,
    results,
    run_load,
)
from tests.support.processes import wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Certs, Upstream, resolve_table

GAP = 0.2
RATE = 1 / GAP
DATA = "data.commoncrawl.org"
CC = "commoncrawl.org"
INDEX = "index.commoncrawl.org"
RECORD_SLACK = 0.02


def paced_toml(schedule: str = "", pacing: str = "") -> str:
    """Robots off (the log holds only the test's requests), 200 ms gap, no jitter, no transparent retries
    (a throttled answer reaches the client, and each upstream arrival is one client request), and no host
    interval, so every paced host shares only the global schedule. The index server rests 1 s after its
    warnings (issue 43's index_rest, 60 s by default), as backoff_base: here it stands for any host."""
    text = NO_ROBOTS + f'[schedule]\nglobal_rate = "{GAP * 1000:g}ms"\n{schedule}\n'
    text += f'[pacing]\nretries = 0\nbackoff_jitter = 0.0\nindex_rest = "1s"\n{pacing}\n'
    text += '[hosts."index.commoncrawl.org"]\ninterval = "0s"\n'
    return text


def upstream_toml(up: Upstream, certs: Certs, extra: str) -> str:
    """The [upstream] table start_proxy writes, plus ``extra`` keys (TOML cannot reopen a table, so a
    test that sets upstream keys passes ``up=None`` to the factory and this table in the config)."""
    return f'[upstream]\nca_file = "{certs.ca_file}"\n{extra}\n[upstream.resolve]\n{resolve_table(up)}\n'


@dataclass
class Load:
    """Load clients (one process per proxy) that run until ``finish`` (tests.support.loadclient --until)."""

    stop: Path
    procs: list[subprocess.Popen[str]]

    @classmethod
    def start(
        cls,
        tmp: Path,
        envs: Sequence[dict[str, str]],
        prefixes: Sequence[Sequence[str]],
        concurrency: int = 4,
    ) -> Load:
        stop = tmp / f"stop-{time.monotonic_ns()}"
        procs = [run_load(env, list(p), concurrency, stop) for env, p in zip(envs, prefixes, strict=True)]
        return cls(stop, procs)

    def finish(self, timeout: float = 60) -> list[dict[str, Any]]:
        self.stop.write_text("stop")
        return [r for p in self.procs for r in results(p, timeout)]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def prefixes(tag: str, *hosts: str) -> list[str]:
    return [f"https://{h}/load/{tag}-{h.split('.')[0]}-" for h in hosts]


def throttle(up: Upstream, host: str, retry_after: str, count: int = 1, status: int = 503) -> float:
    """The next ``count`` requests to ``host`` get ``status`` with Retry-After; returns when it was set."""
    t = time.time()
    up.control({"throttle": {"host": host, "count": count, "status": status, "retry_after": retry_after}})
    return t


def throttled_arrival(up: Upstream, host: str, after: float, timeout: float = 15) -> float:
    """The arrival time of the first request to ``host`` after ``after``: the one the throttle answered."""
    found: list[float] = []

    def seen() -> bool:
        found[:] = [a["t"] for a in up.log() if a["host"] == host and a["t"] >= after]
        return bool(found)

    wait_for(seen, timeout, f"a request to {host} to throttle")
    return min(found)


def arrivals_since(up: Upstream, start: float, tag: str = "/load/") -> list[dict[str, Any]]:
    return sorted((a for a in up.log() if a["t"] >= start and tag in a["path"]), key=lambda a: a["t"])


def sender(path: str) -> str:
    """The load tag and host of a load path (/load/p0-data-12 -> p0-data), else the path without query."""
    parts = path.split("/")
    if len(parts) > 2 and parts[1] == "load":
        return parts[2].rsplit("-", 1)[0]
    return path.split("?")[0]


# The budget check of the fault tests: 2 s windows (ten slots, long against a late grant) and up to 0.4 s of
# lateness (two gaps): what three proxies, their load clients and the other xdist worker cost a grant on a
# 2-core box with a CPU burner beside it (make test-repeat). A proxy that ignored the shared schedule, or
# both fallbacks granting at full rate, puts 20 or more in such a window, so the bound (13) still proves it.
BUDGET_WINDOW = 2.0
BUDGET_LATE = 0.4


def assert_budget(arrivals: Sequence[dict[str, Any]], marks: dict[str, float] | None = None) -> int:
    """No sliding BUDGET_WINDOW holds more than the budget rule allows (tests/support/measure.py), at every
    paced host together. Returns the busiest 1 s window's count, for the test's printout."""
    times = [a["t"] for a in arrivals]
    over = over_budget(times, RATE, BUDGET_WINDOW, BUDGET_LATE)
    if over:
        start, _ = busiest_window(times, BUDGET_WINDOW)
        # Who sent them: the load tag (proxy) and host of each arrival in the busiest window.
        busy = [a for a in arrivals if start <= a["t"] < start + BUDGET_WINDOW]
        who = Counter(sender(a["path"]) for a in busy)
        gaps = " ".join(f"{(b['t'] - a['t']) * 1000:.0f}" for a, b in zip(busy, busy[1:], strict=False))
        raise AssertionError(
            f"{over}; {budget_report(times, RATE, marks)}; by sender {dict(who)}; gaps ms {gaps}"
        )
    return max_in_window(times, 1.0)


def assert_no_request_during(
    arrivals: Sequence[dict[str, Any]], host: str, start: float, seconds: float, what: str
) -> None:
    """Nothing reached ``host`` inside a backoff that began with the upstream's answer at ``start`` and
    lasts ``seconds``. The first RECORD_SLACK (20 ms, a tenth of a gap) is left out: a request already on
    its way when the answer came back was not sent during a *recorded* backoff."""
    during = requests_during(arrivals, host, start + RECORD_SLACK, start + seconds)
    answered = next((sender(a["path"]) for a in arrivals if a["t"] == start), "?")
    assert not during, (
        f"{len(during)} request(s) reached {host} during the {seconds:g}s backoff of {what} "
        f"(answered to {answered}): "
        + ", ".join(f"{a['path']} at +{a['t'] - start:.3f}s" for a in during[:5])
    )


def status_counts(rs: Sequence[dict[str, Any]]) -> Counter[int]:
    return Counter(r["status"] for r in rs)


def assert_clear(rs: Sequence[dict[str, Any]], down: Sequence[tuple[float, float]] = ()) -> None:
    """Every client got a clear answer: a 200 with a body, a 503 that says when to come back, or (only
    while a proxy was down, ``down`` as (start, end) wall times) a failed connection."""
    bad = []
    for r in rs:
        if r["status"] == 200 and r.get("bytes", 1) > 0:
            continue
        if r["status"] == 503 and r.get("retry_after"):
            continue
        if r["status"] == 0 and any(s <= r["t"] and r["t0"] <= e for s, e in down):
            continue
        bad.append(r)
    assert not bad, f"{len(bad)} unclear answers of {len(rs)} ({dict(status_counts(rs))}): {bad[:3]}"


def log_counts(p: ProxyProc) -> dict[str, int]:
    """Traceback and WARNING/ERROR lines in a proxy's log (access lines are INFO and left out)."""
    text = p.log()
    return {
        "traceback": text.count("Traceback (most recent call last)"),
        "warning_or_error": len(re.findall(r"^\S+ \S+ (?:WARNING|ERROR|CRITICAL) ", text, re.M)),
        "lines": text.count("\n"),
    }


def health(p: ProxyProc) -> dict[str, Any]:
    try:
        return dict(json.loads(p.get("/healthz", timeout=3)))
    except OSError:
        return {}


def wait_arrivals(up: Upstream, n: int, after: float, timeout: float = 20) -> None:
    wait_for(lambda: len(arrivals_since(up, after)) >= n, timeout, f"{n} paced arrivals")


class Checks:
    """Every check of a test runs, and the test fails once listing all that failed: one run of a fault
    test then says which of its promises broke, not only the first."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def __call__(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except AssertionError as e:
            self.failed.append(f"{getattr(fn, '__name__', 'check')}: {e}")
            return None

    def that(self, ok: bool, message: str) -> None:
        if not ok:
            self.failed.append(message)

    def done(self) -> None:
        assert not self.failed, "\n".join(self.failed)
