"""Run every benchmark in turn and write one markdown report.

``.venv/bin/python bench/run_all.py [--out FILE] [--quick] [--no-mitm] [--only small,bulk,...]``
runs, one after another so they never compete for the two cores: small_gets (direct, politeproxy,
mitmproxy at c=1/16/64, pacing, cache, exempt ceiling and request window off), bulk (1 GiB, peak RSS),
duckdb_scan (zero-latency upstream), held (10,000 HTTPS requests; ``held-http`` for plain-HTTP clients),
the floor probe (small GETs, 1 GiB and 10,000 held requests through bench/floor_server.py), CPU per
request, workers=2 against workers=1, pacing, cache_bench, politeproxy beside Squid with ssl-bump
(bench/beside_squid.py; skipped without Squid: ``make bench-squid-setup``) and the py-spy profile (when
py-spy is installed). Each step's report records the machine's busy share before and just after it.

``--quick`` gives every step tiny sizes and does not wait for the machine to go quiet:
tests/slow/test_bench_smoke.py runs it that way (``--no-mitm``, the steps the smoke test names).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (  # noqa: E402
    beside_squid,
    bulk,
    cache_bench,
    cpu_per_request,
    duckdb_scan,
    floor_probe,
    held,
    pacing,
    profile_small_gets,
    small_gets,
    workers,
)
from bench.common import ROOT, cpu_busy, log, machine_note, wait_quiet  # noqa: E402

Step = tuple[str, Callable[[list[str]], str], list[str]]


def steps(quick: bool, mitm: bool) -> list[Step]:
    q = ["--quick"] if quick else []
    common = q + ([] if mitm else ["--no-mitm"])
    out: list[Step] = [
        ("small", small_gets.main, [*common, "--mode", "off"]),
        ("bulk", bulk.main, common),
        ("duckdb", duckdb_scan.main, common),
        ("held", held.main, [*q, "--scheme", "https"]),
        ("held-http", held.main, [*q, "--scheme", "http"]),
        ("floor", floor_probe.main, q),
        ("floor", floor_probe.main, [*q, "--bulk"]),
        ("floor", floor_probe.main, [*q, "--held", "20" if quick else "10000"]),
        ("cpu", cpu_per_request.main, [*q, str(ROOT)]),
        ("workers", workers.main, q),
        ("pacing", pacing.main, [*q, "--store", "memory,redis"] if quick else []),
        ("cache", cache_bench.main, q),
        ("squid", beside_squid.main, q),
    ]
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if Path(spy).exists() and not quick:
        out.append(("profile", profile_small_gets.main, ["--mode", "off"]))
        out.append(("profile", profile_small_gets.main, ["--mode", "bulk"]))
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="", help="also write the report to this file")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-mitm", action="store_true")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated: small bulk duckdb held held-http floor cpu workers pacing cache squid profile",
    )
    p.add_argument("--quiet-wait", type=float, default=60.0, help="longest wait for a quiet machine, s")
    a = p.parse_args(argv)
    only = set(a.only.split(",")) - {""}
    head = f"commit {os.popen(f'git -C {ROOT} rev-parse --short HEAD').read().strip() or '?'}"
    parts = [f"Machine: {machine_note()}; {head}; started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"]
    t0 = time.monotonic()
    for name, fn, args in steps(a.quick, not a.no_mitm):
        if only and name not in only:
            continue
        before = cpu_busy(0.5) if a.quick else wait_quiet(max_wait=a.quiet_wait)
        log(f"running {name} {' '.join(args)}")
        started = time.monotonic()
        text = fn(args) or ""
        after = cpu_busy(0.5)
        body = text.split("\n\n", 1)[1] if text.startswith("Machine:") else text
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        parts.append(
            body + f"\n\n_{name}: {time.monotonic() - started:.0f} s; machine busy {before:.0%} before, "
            f"{after:.0%} just after, load average {load} (other work on the machine shows here)._"
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
