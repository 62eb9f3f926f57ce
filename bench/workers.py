"""``politeproxy run --workers 2`` against ``--workers 1`` on this box (issue 28 item 3), with its busy share.

``.venv/bin/python bench/workers.py [--conc 16,64] [--rounds 3] [--duration 4] [--quick]`` starts the fake
upstream and two proxies on data dirs of their own (file store, pacing, cache, exempt ceiling and request
window off), one with one worker and one with two, and drives each with ``hey`` in rotated rounds beside
direct. Per path: req/s, the proxy's CPU per request (the supervisor and all its workers, utime+stime from
/proc) and the machine's busy share meanwhile. On two cores shared with the load generator and the upstream
the wall-clock gain of a second worker cannot show; the CPU per request is what a projection to more cores
starts from (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PACING_OFF,
    Bench,
    Proxy,
    log,
    machine_note,
    make_certs,
    start_politeproxy,
    start_upstream,
    table,
)
from bench.cpu_per_request import cpu_seconds  # noqa: E402
from bench.heyrun import hey  # noqa: E402
from bench.stats import busy_share, cpu_jiffies  # noqa: E402


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (the supervisor and its workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(x) for x in f.read().split()]
        except OSError:
            continue
    return out


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in tree_pids(pid):
        try:
            total += cpu_seconds(p)
        except OSError:
            continue  # a process that ended between the listing and the read
    return total


def measure(px: Proxy | None, url: str, direct: str, c: int, duration: float) -> tuple[float, float, float]:
    """req/s, proxy CPU µs per request (nan for direct), the machine's busy share of both cores."""
    c0, j0 = (tree_cpu(px.pid) if px else 0.0), cpu_jiffies()
    r = hey(url if px else direct, px.url if px else None, c, duration=duration)
    share = busy_share(j0, cpu_jiffies())
    n = max(r.ok, 1)
    us = 1e6 * (tree_cpu(px.pid) - c0) / n if px else float("nan")
    return r.rps, us, share


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conc", default="16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    a = p.parse_args(argv)
    if a.quick:
        a.conc, a.rounds, a.duration = "4", 1, 0.5
    conc = [int(x) for x in a.conc.split(",")]
    path = "/size/1024"
    with Bench() as b:
        up = start_upstream(b, make_certs(b.tmp))
        paths: list[tuple[str, Proxy | None]] = [("direct", None)]
        for n in (1, 2):
            px = start_politeproxy(b, up, PACING_OFF, name=f"workers={n}", run_args=["--workers", str(n)])
            paths.append((f"workers={n}", px))
        direct, url = f"https://127.0.0.1:{up.port}{path}", f"https://{DATA_HOST}{path}"
        for _name, px in paths:  # warm-up: leaves made, pools filled (in every worker)
            hey(url if px else direct, px.url if px else None, 16, duration=0.5 if a.quick else 2.0)
        got: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for r in range(a.rounds):
            for c in conc:
                for name, px in paths[r % 3 :] + paths[: r % 3]:
                    m = measure(px, url, direct, c, a.duration)
                    log(f"workers round {r + 1} c={c} {name}: {m[0]:.0f} req/s, {m[1]:.0f} µs, {m[2]:.0%}")
                    got.setdefault((name, c), []).append(m)
    rows = []
    for c in conc:
        base = statistics.median(x[0] for x in got[("direct", c)])
        one = statistics.median(x[0] for x in got[("workers=1", c)])
        for name, _px in paths:
            v = got[(name, c)]
            rps = statistics.median(x[0] for x in v)
            us = statistics.median(x[1] for x in v)
            share = statistics.median(x[2] for x in v)
            rows.append([str(c), name, f"{rps:.0f}", f"{rps / base:.2f}x", f"{rps / one:.2f}x",
                         "" if name == "direct" else f"{us:.0f}", f"{share:.0%}"])  # fmt: skip
    head = ["conc", "path", "req/s median", "vs direct", "vs workers=1", "proxy CPU µs/req", "machine busy"]
    text = f"Machine: {machine_note()}\n\nworkers=2 against workers=1, small GETs (1 KiB), pacing off, "
    text += f"{a.rounds} rounds of {a.duration:g} s\n\n" + table(head, rows)
    print(text)
    return text


if __name__ == "__main__":
    main()
