"""Figure 2: one 1 GiB streamed download, direct vs politeproxy vs mitmproxy.

``.venv/bin/python bench/bulk.py`` downloads ``/size/N`` (N = 1 GiB) with curl (body to /dev/null) from the
fake upstream directly and through each proxy (pacing off), in alternating rounds, and prints the median
MB/s (10^6 bytes per second) and each proxy's peak RSS (VmHWM, reset before each download).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    Bench,
    add_compare_args,
    compared_paths,
    fmt,
    hwm_mib,
    log,
    machine_note,
    make_certs,
    median,
    ratio,
    reset_hwm,
    rss_mib,
    start_upstream,
    table,
)
from bench.workloads import curl_download  # noqa: E402

GIB = 1 << 30


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    p.add_argument(
        "--cache", action="store_true", help="only the cache's figures, one run (bench/cache_bench.py)"
    )
    p.add_argument("--size", type=int, default=GIB, help="bytes (default 1 GiB)")
    p.add_argument("--rounds", type=int, default=3)
    add_compare_args(p)
    a = p.parse_args(argv)
    if a.cache:  # issue 14: the cache's figures live in one script, which both of these front
        from bench import cache_bench

        return cache_bench.main(["--quick"] if a.quick else [])
    if a.quick:
        a.size, a.rounds = 8 << 20, 1
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = start_upstream(b, certs)
        targets = compared_paths(b, up, a.candidate, not a.no_mitm)
        url = f"https://{DATA_HOST}/size/{a.size}"
        idle = {name: rss_mib(px.pid) for name, px in targets if px}
        speeds: dict[str, list[float]] = {}
        peaks: dict[str, list[float]] = {}
        for r in range(a.rounds):
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            for name, px in order:
                if px:
                    reset_hwm(px.pid)
                speed = curl_download(url, a.size, px.ca_file if px else certs.ca_file, px, up.port)
                speeds.setdefault(name, []).append(speed)
                if px:
                    peaks.setdefault(name, []).append(hwm_mib(px.pid))
                log(f"bulk round {r + 1} {name}: {speed / 1e6:.0f} MB/s")
        direct = median(speeds["direct"])
        rows = []
        for name, px in targets:
            s = median(speeds[name])
            rows.append(
                [
                    name,
                    fmt(s / 1e6, 0),
                    ratio(s, direct) if px else "",
                    fmt(idle[name], 1) if px else "",
                    fmt(max(peaks[name]), 1) if px else "",
                ]
            )
        mib = a.size / (1 << 20)
        text = (
            f"Machine: {machine_note()}\n\n### One {mib:,.0f} MiB streamed download (curl, pacing off), "
            f"{a.rounds} rounds, medians\n\n"
            + table(["path", "MB/s", "vs direct", "proxy RSS idle MiB", "proxy peak RSS MiB (VmHWM)"], rows)
        )
    print(text)
    return text


if __name__ == "__main__":
    main()
