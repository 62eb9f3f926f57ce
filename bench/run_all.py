"""Run every benchmark in turn and write one markdown report.

``.venv/bin/python bench/run_all.py [--out FILE] [--quick] [--no-mitm] [--only small,bulk,...]``
runs small_gets, bulk, duckdb_scan, held (plain HTTP and HTTPS clients), pacing, cache_bench and the
py-spy profile (when py-spy is installed), one after another so they never compete for the two cores,
and prints (and with ``--out`` writes) the report.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bulk, cache_bench, duckdb_scan, held, pacing, profile_small_gets, small_gets  # noqa: E402
from bench.common import cpu_busy, log, machine_note, wait_quiet  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="", help="also write the report to this file")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-mitm", action="store_true")
    p.add_argument(
        "--only", default="", help="comma-separated subset: small,bulk,duckdb,held,pacing,cache,profile"
    )
    a = p.parse_args(argv)
    common = (["--quick"] if a.quick else []) + (["--no-mitm"] if a.no_mitm else [])
    nomitm = ["--quick"] if a.quick else []
    steps: list[tuple[str, Callable[[list[str]], str], list[str]]] = [
        ("small", small_gets.main, common),
        ("bulk", bulk.main, common),
        ("duckdb", duckdb_scan.main, common),
        ("held", held.main, [*nomitm, "--scheme", "http"]),
        ("held", held.main, [*nomitm, "--scheme", "https"]),
        ("pacing", pacing.main, nomitm),
        ("cache", cache_bench.main, []),
    ]
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if Path(spy).exists() and not a.quick:
        steps.append(("profile", profile_small_gets.main, ["--mode", "off"]))
    only = set(a.only.split(",")) - {""}
    parts = [f"Machine: {machine_note()}; started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"]
    t0 = time.monotonic()
    for name, fn, args in steps:
        if only and name not in only:
            continue
        before = wait_quiet()
        log(f"running {name} {' '.join(args)}")
        started = time.monotonic()
        text = fn(args)
        after = cpu_busy()
        body = text.split("\n\n", 1)[1] if text.startswith("Machine:") else text
        parts.append(
            body + f"\n\n_{name}: {time.monotonic() - started:.0f} s; machine busy {before:.0%} before, "
            f"{after:.0%} just after (other work on the machine shows here)._"
        )
    parts.append(f"Total time {time.monotonic() - t0:.0f} s.")
    report = "\n\n".join(parts) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)
        log(f"wrote {a.out}")
    return report


if __name__ == "__main__":
    main()
