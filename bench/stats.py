"""Benchmark statistics and machine facts: percentiles, tables, Prometheus histograms, RSS, CPU load."""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from politeproxy.proxy.common.fastnet import OFF_WORDS


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- memory ----------------------------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def rss_mib(pid: int) -> float:
    return _status_kib(pid, "VmRSS") / 1024


def hwm_mib(pid: int) -> float:
    """Peak resident set size (VmHWM) since start or the last ``reset_hwm``."""
    return _status_kib(pid, "VmHWM") / 1024


def reset_hwm(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# -- statistics and tables ----------------------------------------------------------------------


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile, ``p`` in 0..100."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: Iterable[float]) -> float:
    v = [x for x in xs if x == x]
    return statistics.median(v) if v else float("nan")


def spread(xs: Sequence[float], digits: int = 0) -> str:
    """A series of rounds as ``median (min-max)``."""
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def ratio(a: float, b: float) -> str:
    if b == 0 or a != a or b != b:
        return "–"
    return f"{a / b:.2f}x"


def fmt(x: float, digits: int = 1) -> str:
    if x != x:
        return "–"
    return f"{x:,.{digits}f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def hist_buckets(metrics_text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of a Prometheus histogram, summed over its label sets."""
    buckets: dict[float, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket{"):
            labels, _, value = line.rpartition(" ")
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def bucket_diff(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {b: c - before.get(b, 0.0) for b, c in after.items()}


def bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """Prometheus-style quantile: linear within the bucket that holds the rank."""
    if not buckets:
        return float("nan")
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return float("nan")
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if b == float("inf"):
                return prev_bound
            return prev_bound + (b - prev_bound) * (rank - prev_count) / max(c - prev_count, 1e-12)
        prev_bound, prev_count = b, c
    return bounds[-1]


def histogram_quantile(metrics_text: str, name: str, q: float) -> float:
    return bucket_quantile(hist_buckets(metrics_text, name), q)


def cpu_jiffies() -> tuple[int, int]:
    """(total, idle) jiffies of the whole machine since boot, from /proc/stat (idle counts iowait)."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals), idle


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The machine's busy share of all cores (0..1) between two ``cpu_jiffies()`` readings."""
    total, idle = after[0] - before[0], after[1] - before[1]
    return (total - idle) / max(1, total)


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of all cores busy over ``interval`` seconds (0..1), from /proc/stat."""
    before = cpu_jiffies()
    time.sleep(interval)
    return busy_share(before, cpu_jiffies())


def wait_quiet(threshold: float = 0.15, max_wait: float = 60.0) -> float:
    """Wait (bounded) until the machine is nearly idle, so other work does not skew a figure.

    Returns the busy fraction last seen; a benchmark sharing the machine says so in its report.
    """
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > threshold and time.monotonic() < deadline:
        log(f"machine {busy:.0%} busy before the run; waiting for it to settle")
        busy = cpu_busy(2.0)
    return busy


def machine_note() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # The transports politeproxy gets here: aiofastnet when installed, unless POLITEPROXY_FASTNET is off.
    off = os.environ.get("POLITEPROXY_FASTNET", "").strip().lower() in OFF_WORDS
    fast = "off" if off else ("on" if importlib.util.find_spec("aiofastnet") else "not installed")
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {sys.version.split()[0]} ({interpreter()}), "
        f"{os.uname().sysname}, politeproxy's aiofastnet transports: {fast}"
    )


def interpreter() -> str:
    """Which build of Python runs the benchmark, and the proxy unless ``--python`` names others (their
    labels then name each): its path, and whether it runs on a shared libpython. The build sets about an
    eighth of politeproxy's CPU (docs/benchmarks.md): Debian's python3 (statically linked, PGO and LTO)
    against a pyenv build with the defaults (neither)."""
    try:
        shared = "libpython" in Path("/proc/self/maps").read_text()
    except OSError:
        return os.path.realpath(sys.executable)
    return f"{os.path.realpath(sys.executable)}, {'shared' if shared else 'static'} libpython"
