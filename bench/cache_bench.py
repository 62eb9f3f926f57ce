"""Issue 14's figures: what the shared cache saves and costs, against direct, in one run.

``.venv/bin/python bench/cache_bench.py`` serves from the fake upstream (a) the parquet file of
bench/duckdb_scan.py under /cc-index/table/ and (b) a 64 MiB object (the default ``cache.max_object``).
Each round starts a proxy on an empty data dir, then times:
  * the duckdb scan (fresh duckdb process each) direct, through the proxy the first time (misses, teed to
    disk) and the second time (every read a hit), with the upstream requests each made;
  * the 64 MiB download (curl) direct, through the proxy the first time and the second (from disk).
The fake upstream holds each answer ``--latency`` seconds (default 20 ms, a near CDN edge; the real
one is further away), so "direct" pays a round trip per request as it would. Prints the medians and the
ratios to direct.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    Bench,
    fmt,
    log,
    machine_note,
    make_certs,
    median,
    ratio,
    start_politeproxy,
    start_upstream,
    table,
)
from bench.workloads import (  # noqa: E402
    TABLE_PATH,
    curl_download,  # noqa: E402
    run_query,
    write_parquet,
)

OBJECT = "/cc-index/table/cc-main/object-64MiB.bin"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--row-group", type=int, default=50_000)
    p.add_argument("--size", type=int, default=64 << 20, help="the object's bytes (default 64 MiB)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--latency",
        type=float,
        default=0.02,
        help="seconds the fake upstream holds each answer (a near CDN edge; 0 = a local upstream)",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.rows, a.row_group, a.size, a.rounds = 20_000, 5_000, 4 << 20, 1
    with Bench() as b:
        certs = make_certs(b.tmp)
        files = b.tmp / "files"
        files.mkdir()
        write_parquet(files / TABLE_PATH.rsplit("/", 1)[-1], a.rows, a.row_group)
        (files / OBJECT.rsplit("/", 1)[-1]).write_bytes(b"w" * a.size)
        up = start_upstream(b, certs, files)
        up.control({"table_delay": a.latency})  # every /cc-index/table/ answer, direct or proxied
        scans: dict[str, list[float]] = {}
        reqs: dict[str, list[int]] = {}
        speeds: dict[str, list[float]] = {}
        for r in range(a.rounds + 1):  # round 0 warms the page cache and duckdb's extension load; not counted
            pp = start_politeproxy(b, up)  # an empty cache each round
            runs = [("direct", None), ("proxy, first scan", pp), ("proxy, second scan", pp)]
            for name, px in runs:
                host = f"localhost:{up.port}" if px is None else DATA_HOST
                up.reset()  # clears the log (the table delay stays)
                res = run_query(f"https://{host}{TABLE_PATH}", px, px.ca_file if px else certs.ca_file)
                n = len(up.log())
                if r:
                    scans.setdefault(name, []).append(res["seconds"])
                    reqs.setdefault(name, []).append(n)
                log(f"cache round {r} duckdb {name}: {res['seconds']:.3f} s, {n} upstream requests")
            runs = [("direct", None), ("proxy, first (miss)", pp), ("proxy, cached (hit)", pp)]
            for name, px in runs:
                url = f"https://{DATA_HOST}{OBJECT}"
                up.reset()
                speed = curl_download(url, a.size, px.ca_file if px else certs.ca_file, px, up.port)
                n = len(up.log())
                if r:
                    speeds.setdefault(name, []).append(speed)
                    reqs.setdefault("object " + name, []).append(n)
                log(f"cache round {r} object {name}: {speed / 1e6:.0f} MB/s, {n} upstream requests")
        return _report(a, scans, speeds, reqs)


def _report(
    a: argparse.Namespace,
    scans: dict[str, list[float]],
    speeds: dict[str, list[float]],
    reqs: dict[str, list[int]],
) -> str:
    direct = median(scans["direct"])
    scan_rows = [
        [name, fmt(median(v), 3), ratio(median(v), direct) if name != "direct" else "", max(reqs[name])]
        for name, v in scans.items()
    ]
    d = median(speeds["direct"])
    bulk_rows = [
        [
            name,
            fmt(median(v) / 1e6, 0),
            ratio(median(v), d) if name != "direct" else "",
            max(reqs["object " + name]),
        ]
        for name, v in speeds.items()
    ]
    text = (
        f"Machine: {machine_note()}\n\n### duckdb scan, first and second through the proxy against direct "
        f"({a.rows:,} rows, {a.rows // a.row_group} row groups; "
        f"upstream answers held {a.latency * 1000:g} ms), "
        f"{a.rounds} rounds, medians\n\n"
        + table(["path", "wall s", "vs direct", "upstream requests"], scan_rows)
        + f"\n\n### A {a.size / (1 << 20):.0f} MiB object (curl), first and cached, "
        f"{a.rounds} rounds, medians\n\n"
        + table(["path", "MB/s", "vs direct", "upstream requests"], bulk_rows)
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
