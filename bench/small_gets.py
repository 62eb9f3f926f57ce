"""Figure 1: small intercepted GETs that are not paced, direct vs politeproxy vs mitmproxy.

``.venv/bin/python bench/small_gets.py`` starts the fake upstream, politeproxy (pacing off) and mitmdump,
then drives each with ``hey`` (keep-alive, HTTPS through the proxy via CONNECT; or bench/loadgen.py with
``--loadgen python``) at concurrency 1, 16 and 64, in alternating rounds, and prints a markdown table of
medians: requests per second, latency p50/p99, and the ratios the targets are stated in.

Modes: ``off`` GETs /size/N with ``global_rate = "0"`` (paced class, pacing off); ``exempt`` sends
``Range: bytes=0-N`` to /cc-index/table/... (the exempt class, default ``exempt.max_in_flight`` 16).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PY,
    ROOT,
    Bench,
    Proxy,
    Upstream,
    add_compare_args,
    compared_paths,
    fmt,
    log,
    machine_note,
    make_certs,
    median,
    ratio,
    start_upstream,
    table,
)
from bench.heyrun import Run, hey  # noqa: E402
from bench.stats import cpu_seconds  # noqa: E402


def run_python(
    url: str, proxy: str | None, cafile: str | None, c: int, duration: float, headers: list[str]
) -> Run:
    cmd = [PY, str(ROOT / "bench" / "loadgen.py"), url, "--concurrency", str(c), "--duration", str(duration)]
    for h in headers:
        cmd += ["--header", h]
    if proxy:
        cmd += ["--proxy", proxy]
    if cafile:
        cmd += ["--cafile", cafile]
    r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return Run(r["rps"], r["p50"], r["p99"], r["errors"], r["requests"])  # loadgen counts only 200/206


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    p.add_argument("--concurrency", default=None, help="comma-separated (default 1,16,64)")
    p.add_argument("--size", type=int, default=1024, help="response body bytes")
    p.add_argument("--mode", choices=("off", "exempt", "both"), default="both")
    p.add_argument("--loadgen", choices=("auto", "hey", "python"), default="auto")
    add_compare_args(p)
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.duration = 1, 0.3  # and 0.3 s warm-ups: the smoke test reads only the rows and errors
        a.concurrency = a.concurrency or "1,4"
    a.conc = [int(x) for x in (a.concurrency or "1,16,64").split(",")]
    a.loadgen = a.loadgen if a.loadgen != "auto" else ("hey" if shutil.which("hey") else "python")
    return a


Targets = list[tuple[str, Proxy | None]]


def measure_mode(
    a: argparse.Namespace, up: Upstream, targets: Targets, mode: str
) -> dict[tuple[str, int], list[Run]]:
    """Warm every path up, then ``a.rounds`` rounds of every (concurrency, path), rotating the order; each
    run records its proxy's CPU seconds from /proc (bench/beside_squid.py reads them per request)."""
    if mode == "off":
        path, headers = f"/size/{a.size}", []
    else:
        path, headers = "/cc-index/table/small.bin", [f"Range: bytes=0-{a.size - 1}"]

    def measure(px: Proxy | None, c: int, duration: float) -> Run:
        host = f"127.0.0.1:{up.port}" if px is None else px.host
        url = f"https://{host}{path}"
        if a.loadgen == "hey":
            return hey(url, px.url if px else None, c, duration=duration, headers=headers)
        cafile = str(px.ca_file if px else up.ca_file)
        return run_python(url, px.url if px else None, cafile, c, duration, headers)

    for name, px in targets:  # warm-up: leaves cached, upstream pools filled
        for c in a.conc:
            try:
                measure(px, c, min(1.0, a.duration))
            except RuntimeError as e:  # a first request may be slow (mitmproxy makes its leaf)
                log(f"warm-up {name} c={c}: {str(e)[:80]}")
    results: dict[tuple[str, int], list[Run]] = {}
    for r in range(a.rounds):
        for c in a.conc:
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            for name, px in order:
                c0 = cpu_seconds(px.pid) if px else 0.0
                run = measure(px, c, a.duration)
                run.cpu = cpu_seconds(px.pid) - c0 if px else float("nan")
                log(f"{mode} round {r + 1} c={c} {name}: {run.rps:.0f} req/s p50 {run.p50 * 1e3:.2f} ms")
                results.setdefault((name, c), []).append(run)
    return results


HEADERS = ["conc", "path", "req/s", "p50 ms", "p99 ms", "vs direct", "vs mitmproxy", "added p50 ms", "errors"]


def _rows(conc: list[int], targets: Targets, results: dict[tuple[str, int], list[Run]]) -> list[list[object]]:
    """Medians per (concurrency, path), with the ratios the targets are stated in."""
    rows: list[list[object]] = []
    for c in conc:
        med = {
            n: (
                median(x.rps for x in results[(n, c)]),
                median(x.p50 for x in results[(n, c)]),
                median(x.p99 for x in results[(n, c)]),
                sum(x.errors for x in results[(n, c)]),
            )
            for n, _ in targets
        }
        d = med["direct"]
        for n, _ in targets:
            rps, p50, p99, errs = med[n]
            vs_mitm = ratio(rps, med["mitmproxy"][0]) if "mitmproxy" in med and n != "mitmproxy" else ""
            rows.append(
                [
                    c,
                    n,
                    fmt(rps, 0),
                    fmt(p50 * 1e3, 2),
                    fmt(p99 * 1e3, 2),
                    ratio(rps, d[0]) if n != "direct" else "",
                    vs_mitm if n in ("politeproxy", "candidate") else "",
                    f"+{(p50 - d[1]) * 1e3:.2f}" if n != "direct" else "",
                    errs,
                ]
            )
    return rows


def main(argv: list[str] | None = None) -> str:
    a = parse_args(argv)
    modes = ["off", "exempt"] if a.mode == "both" else [a.mode]
    out: list[str] = []
    with Bench() as b:
        certs = make_certs(b.tmp)
        files = b.tmp / "files"
        files.mkdir()
        (files / "small.bin").write_bytes(b"y" * max(a.size, 1))
        up = start_upstream(b, certs, files)
        targets = compared_paths(b, up, a.candidate, not a.no_mitm)
        for mode in modes:
            results = measure_mode(a, up, targets, mode)
            title = (
                f"Small GETs ({a.size} B, mode {mode}: "
                + ("pacing off" if mode == "off" else "exempt Range reads")
                + f"), {a.loadgen}, {a.rounds} rounds x {a.duration:g} s, medians"
            )
            out.append(f"### {title}\n\n" + table(HEADERS, _rows(a.conc, targets, results)))
    text = f"Machine: {machine_note()}\n\n" + "\n\n".join(out)
    print(text)
    return text


if __name__ == "__main__":
    main()
