"""The proxy's own CPU time per request, for source trees side by side: the steady figure on a shared box.

``.venv/bin/python bench/cpu_per_request.py TREE [TREE ...] [--mode off|exempt|bulk] [--conc 1,64]
[-n 4000] [--rounds 4] [--no-keepalive]`` starts one fake upstream and one politeproxy per source tree
(pacing off), warms each up, then drives them with ``hey -n N`` in interleaved rounds (ABAB, then BABA, ...)
and reads each proxy's utime+stime from /proc before and after. ``--mode bulk`` asks for 64 MiB answers,
so its µs/request is µs per 64 MiB. Wall-clock throughput on a box shared with other work swings by tens
of percent; CPU seconds per request move much less, so this is the figure to compare. Prints one line per
measurement and a table: per tree the median µs/request, and the ratio of each tree against the first,
per round pair (median and range).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PACING_OFF,
    Bench,
    add_python_arg,
    make_certs,
    start_politeproxy,
    start_upstream,
    tree_runs,
)
from bench.heyrun import hey  # noqa: E402
from bench.stats import cpu_seconds as cpu_seconds  # noqa: E402 - re-exported: workers, floor_probe
from bench.stats import spread  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", type=Path)
    p.add_argument("--mode", choices=("off", "exempt", "bulk"), default="off")
    p.add_argument("--conc", default="1,64")
    p.add_argument("-n", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--no-keepalive", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    add_python_arg(p)
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.rounds, a.conc = min(a.n, 200), 1, "4"
    conc = [int(c) for c in a.conc.split(",")]
    if a.mode == "off":
        path, headers, extra = "/size/1024", [], PACING_OFF
    elif a.mode == "bulk":  # 64 MiB per request: the per-byte cost (read -n 10 -c 1 as 640 MiB)
        path, headers, extra = f"/size/{64 * 2**20}", [], PACING_OFF
    else:
        path, headers = "/cc-index/table/small.bin", ["Range: bytes=0-1023"]
        extra = PACING_OFF.replace("[exempt]\n", "[exempt]\nmax_in_flight = 64\n")  # ceiling off already
    url = f"https://{DATA_HOST}{path}"
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = start_upstream(b, certs)
        runs = tree_runs(a.trees, a.python)
        names = [label for _t, _py, label in runs]
        pxs = [start_politeproxy(b, up, extra, src=t, python=py) for t, py, _label in runs]
        for px in pxs:
            hey(url, px.url, 16, n=2 if a.mode == "bulk" else min(1000, a.n), headers=headers)
        us: dict[tuple[str, int], list[float]] = {}
        for r in range(a.rounds):
            for c in conc:
                order = list(zip(names, pxs, strict=True))
                for name, px in order if r % 2 == 0 else order[::-1]:
                    c0 = cpu_seconds(px.pid)
                    rps = hey(url, px.url, c, n=a.n, headers=headers, keepalive=not a.no_keepalive).rps
                    per = 1e6 * (cpu_seconds(px.pid) - c0) / a.n
                    us.setdefault((name, c), []).append(per)
                    print(f"round {r} c={c} {name}: {per:.0f} us/req, {rps:.0f} req/s", flush=True)
    unit = "µs per 64 MiB" if a.mode == "bulk" else "µs/req"
    keep = not a.no_keepalive
    lines = [f"Proxy CPU per request: mode {a.mode}, n={a.n}, {a.rounds} rounds, keepalive={keep}", "",
             f"| conc | tree | {unit} median (range) | ratio vs first, median (range) |",
             "|---|---|---|---|"]  # fmt: skip
    for c in conc:
        base = us[(names[0], c)]
        for name in names:
            v = us[(name, c)]
            rs = [x / y for x, y in zip(v, base, strict=True)]
            lines.append(f"| {c} | {name} | {spread(v)} | {spread(rs, 3)} |")
    text = "\n".join(lines)
    print("\n" + text)
    return text


if __name__ == "__main__":
    main()
