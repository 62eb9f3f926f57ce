"""Figure 2: one 1 GiB streamed download, direct vs politeproxy vs mitmproxy.

``.venv/bin/python bench/bulk.py`` downloads ``/size/N`` (N = 1 GiB) with curl (body to /dev/null) from the
fake upstream directly and through each proxy (pacing off), in alternating rounds, and prints the median
MB/s (10^6 bytes per second) and each proxy's peak RSS (VmHWM, reset before each download).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    Bench,
    Proxy,
    Upstream,
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
from bench.stats import cpu_seconds  # noqa: E402
from bench.workloads import curl_download  # noqa: E402

Targets = list[tuple[str, Proxy | None]]

GIB = 1 << 30


@dataclass
class Downloads:
    """One path's downloads over the rounds: bytes/s, the proxy's peak RSS (MiB) and CPU s per GiB each."""

    speeds: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    cpu_per_gib: list[float] = field(default_factory=list)


def download_rounds(targets: Targets, up: Upstream, size: int, rounds: int) -> dict[str, Downloads]:
    """``rounds`` downloads of /size/``size`` by every path, rotating the order (bench/beside_squid too)."""
    got: dict[str, Downloads] = {name: Downloads() for name, _ in targets}
    for r in range(rounds):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        for name, px in order:
            if px:
                reset_hwm(px.pid)
            c0 = cpu_seconds(px.pid) if px else 0.0
            url = f"https://{px.host if px else DATA_HOST}/size/{size}"
            speed = curl_download(url, size, px.ca_file if px else up.ca_file, px, up.port)
            got[name].speeds.append(speed)
            if px:
                got[name].peaks.append(hwm_mib(px.pid))
                got[name].cpu_per_gib.append((cpu_seconds(px.pid) - c0) * GIB / size)
            log(f"bulk round {r + 1} {name}: {speed / 1e6:.0f} MB/s")
    return got


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
        idle = {name: rss_mib(px.pid) for name, px in targets if px}
        got = download_rounds(targets, up, a.size, a.rounds)
        direct = median(got["direct"].speeds)
        rows = []
        for name, px in targets:
            s = median(got[name].speeds)
            rows.append(
                [
                    name,
                    fmt(s / 1e6, 0),
                    ratio(s, direct) if px else "",
                    fmt(idle[name], 1) if px else "",
                    fmt(max(got[name].peaks), 1) if px else "",
                    fmt(median(got[name].cpu_per_gib), 2) if px else "",
                ]
            )
        mib = a.size / (1 << 20)
        head = ["path", "MB/s", "vs direct", "proxy RSS idle MiB", "proxy peak RSS MiB (VmHWM)"]
        head.append("proxy CPU s/GiB")
        text = (
            f"Machine: {machine_note()}\n\n### One {mib:,.0f} MiB streamed download (curl, pacing off), "
            f"{a.rounds} rounds, medians\n\n" + table(head, rows)
        )
    print(text)
    return text


if __name__ == "__main__":
    main()
