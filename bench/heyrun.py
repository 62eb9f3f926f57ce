"""One run of ``hey`` (the load generator every small-GET figure uses) and what its report says.

Each benchmark asks it differently: for a duration (``small_gets``, ``workers``, ``floor_probe``), for a count
(``cpu_per_request``, ``instructions``), with headers or without keep-alive. One runner, one parser of hey's
text report: the figures cannot read it two ways.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

NUM = r"([\d.]+|NaN)"  # hey prints NaN for the average of a run in which no request was answered


@dataclass
class Run:
    rps: float
    p50: float
    p99: float
    errors: int
    ok: int  # answers 200 or 206
    cpu: float = float("nan")  # the proxy's CPU seconds (utime + stime) during the run; nan for direct


def hey(
    url: str,
    proxy: str | None,
    c: int,
    *,
    n: int | None = None,
    duration: float | None = None,
    headers: Sequence[str] = (),
    keepalive: bool = True,
    timeout: int = 20,
) -> Run:
    """``n`` GETs of ``url`` (or as many as ``duration`` seconds take) at ``c`` clients through ``proxy``
    (None: direct); ``timeout``: hey's own per request. Raises when hey printed no report."""
    if (n is None) == (duration is None):
        raise ValueError("hey: give n or duration, not both")
    cmd = ["hey", "-c", str(c), "-t", str(timeout)]
    cmd += ["-n", str(n)] if n is not None else ["-z", f"{duration}s"]
    for h in headers:
        cmd += ["-H", h]
    if not keepalive:
        cmd.append("-disable-keepalive")
    if proxy:
        cmd += ["-x", proxy]
    # bounded: a count at hey's slowest (every request timing out) or the duration, and a minute to spare
    limit = (duration or 0) + 60 + (n * timeout / c if n is not None else 0)
    out = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=limit).stdout
    return parse(out)


def parse(out: str) -> Run:
    """hey's text report: rate, p50 and p99 (its average and slowest when it printed no percentiles; NaN
    when nothing was answered), the 200 and 206 answers, and every other answer or error."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(rf"50% in {NUM} secs", out) or re.search(rf"Average:\s+{NUM} secs", out)
    p99 = re.search(rf"99% in {NUM} secs", out) or re.search(rf"Slowest:\s+{NUM} secs", out)
    if not rps or not p50 or not p99:
        raise RuntimeError(f"cannot parse hey output:\n{out[-2000:]}")
    ok = sum(int(k) for k in re.findall(r"\[20[06]\]\s+(\d+) responses", out))
    total = sum(int(k) for k in re.findall(r"\[\d+\]\s+(\d+) responses", out))
    errs = re.search(r"Error distribution:(.*)", out, re.S)
    failed = sum(int(k) for k in re.findall(r"\[(\d+)\]", errs.group(1))) if errs else 0
    return Run(float(rps.group(1)), float(p50.group(1)), float(p99.group(1)), total - ok + failed, ok)
