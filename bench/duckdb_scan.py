"""Figure 3: a duckdb columnar scan of a parquet file, direct vs through politeproxy vs mitmproxy.

``.venv/bin/python bench/duckdb_scan.py`` writes a parquet file shaped like Common Crawl's columnar index
(many row groups; url, url_host_name, fetch_status, warc_record_length, content_mime_type), serves it from
the fake upstream under /cc-index/table/, and times, each in a fresh duckdb process, a query that reads
three of its columns with range requests (httpfs). Through politeproxy those reads are exempt (not paced;
default ``exempt.max_in_flight``). Prints the median wall time per path and the ratio to direct.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CACHE_OFF,
    DATA_HOST,
    EXEMPT_CEILING_OFF,
    WINDOW_OFF,
    Bench,
    Proxy,
    fmt,
    log,
    machine_note,
    make_certs,
    maybe_mitmdump,
    median,
    ratio,
    start_politeproxy,
    start_upstream,
    table,
)
from bench.workloads import TABLE_PATH, run_query, write_parquet  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    p.add_argument(
        "--cache", action="store_true", help="only the cache's figures, one run (bench/cache_bench.py)"
    )
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--row-group", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-mitm", action="store_true", help="skip mitmproxy (no PyPI install)")
    a = p.parse_args(argv)
    if a.cache:  # issue 14: the cache's figures live in one script, which both of these front
        from bench import cache_bench

        return cache_bench.main(["--quick"] if a.quick else [])
    if a.quick:
        a.rows, a.row_group, a.rounds = 20_000, 5_000, 1
    with Bench() as b:
        certs = make_certs(b.tmp)
        files = b.tmp / "files"
        files.mkdir()
        pq_file = files / TABLE_PATH.rsplit("/", 1)[-1]
        write_parquet(pq_file, a.rows, a.row_group)
        size_mb = pq_file.stat().st_size / 1e6
        up = start_upstream(b, certs, files)
        # Default pacing: the scan must pass as exempt. The cache and the exempt ceiling are off: this figure
        # is the exempt path itself (bench/cache_bench.py has the cache's first and second scans).
        pp = start_politeproxy(b, up, CACHE_OFF + EXEMPT_CEILING_OFF + WINDOW_OFF)
        mitm = maybe_mitmdump(b, up, not a.no_mitm)
        targets: list[tuple[str, Proxy | None]] = [("direct", None), ("politeproxy", pp)]
        if mitm:
            targets.append(("mitmproxy", mitm))
        times: dict[str, list[float]] = {}
        reqs: dict[str, int] = {}
        for r in range(a.rounds + 1):  # round 0 warms page cache and leaves; not counted
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            for name, px in order:
                host = f"localhost:{up.port}" if px is None else DATA_HOST
                url = f"https://{host}{TABLE_PATH}"
                up.reset()
                res = run_query(url, px, px.ca_file if px else certs.ca_file)
                n = len(up.log())
                if r == 0:
                    continue
                times.setdefault(name, []).append(res["seconds"])
                reqs[name] = n
                log(f"duckdb round {r} {name}: {res['seconds']:.3f} s, {n} upstream requests")
        direct = median(times["direct"])
        rows = [
            [name, fmt(median(times[name]), 3), ratio(median(times[name]), direct) if px else "", reqs[name]]
            for name, px in targets
        ]
        text = (
            f"Machine: {machine_note()}\n\n### duckdb scan of a {size_mb:.0f} MB parquet file "
            f"({a.rows:,} rows, {a.rows // a.row_group} row groups; 3 of 5 columns read), "
            f"{a.rounds} rounds, medians\n\n"
            + table(["path", "wall s", "vs direct", "upstream requests"], rows)
        )
    print(text)
    return text


if __name__ == "__main__":
    main()
