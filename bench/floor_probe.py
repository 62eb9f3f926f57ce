"""The floor of issue 15: what the least Python asyncio proxy that terminates TLS on both legs costs here.

The floor probe is the minimal intercepting forward proxy of ``bench/floor_server.py`` (uvloop, httptools,
one pooled verified-TLS upstream; no pacing, logs, metrics or store), run in its own process: an upper
bound on what any proxy of this shape can do for small GETs and held requests, not a proxy.

``.venv/bin/python bench/floor_probe.py [--rounds 3] [--duration 4] [--conc 1,16,64]`` starts the fake
upstream, the floor probe and politeproxy (pacing, cache and exempt ceiling off, as bench/small_gets.py's
mode off) and drives each with ``hey`` (keep-alive HTTPS through the proxy) in rotated rounds. Per
concurrency: req/s median (range), the per-round ratio to direct, each proxy's CPU µs per 200 answer
(utime+stime from /proc) and how busy both cores were (/proc/stat).

``--held N`` (default 2000 when given bare) instead opens N TLS clients through the floor probe, each
sending one GET the probe holds (a future per request, no forwarding) and reports the probe's RSS idle and
at the peak: KiB per held request. ``--bulk [BYTES]`` (1 GiB when given bare) downloads once per path
and round with curl through direct, the floor and politeproxy: MB/s and each proxy's CPU seconds per GiB
(for bulk the floor is not a floor: "Bulk through the floor probe" in the old notebook,
``git show 04f570b:BENCHMARKS.md``; docs/benchmarks.md has the current figures). Needs
``.venv/bin/pip install httptools``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import httptools  # noqa: F401 - the floor server's parser: say so here, before anything starts
except ImportError:
    print("floor_probe: httptools is missing; install it with `.venv/bin/pip install httptools`")
    sys.exit(2)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.common import DATA_HOST, PY, Bench, log, make_certs, rss_mib, table  # noqa: E402
from bench.cpu_per_request import cpu_seconds  # noqa: E402
from bench.floor_server import raise_nofile  # noqa: E402
from bench.heyrun import hey  # noqa: E402
from bench.stats import busy_share, cpu_jiffies, spread  # noqa: E402
from bench.workloads import curl_download  # noqa: E402
from tests.support.processes import wait_for  # noqa: E402

# -- the driver -----------------------------------------------------------------------------------------


def start_floor(
    b: Bench, up: Any, certs: Any, lifetime: float, wrap: Sequence[str] = (), ready_within: float = 30
) -> common.Proxy:
    """The floor probe (bench/floor_server.py) in its own process (under ``wrap``, a command, when given)."""
    pf = b.tmp / f"floor-port-{time.monotonic_ns()}"
    server = Path(__file__).resolve().parent / "floor_server.py"
    cmd = [*wrap, PY, str(server), "--port-file", str(pf), "--upstream-port",
           str(up.port), "--ca", str(certs.ca_file), "--cert", str(certs.server_pem),
           "--lifetime", str(lifetime)]  # fmt: skip
    proc = b.spawn(cmd, "floor.log")
    ready = lambda: pf.exists() and pf.read_text() != "" or proc.poll() is not None  # noqa: E731
    wait_for(ready, ready_within, "floor probe")
    if proc.poll() is not None:
        raise RuntimeError(f"floor probe exited: {(b.tmp / 'floor.log').read_text()}")
    return common.Proxy("floor", proc, int(pf.read_text()), certs.ca_file)


Sample = dict[str, list[float]]
Path3 = tuple[str, str | None, int | None]  # name, proxy URL, proxy pid


def measure_paths(a: argparse.Namespace, paths: list[Path3], url: str, direct: str) -> dict[int, Sample]:
    """Interleaved rounds; per concurrency and path: req/s, CPU µs/request and the machine's busy share."""
    got: dict[int, Sample] = {c: {} for c in a.conc}
    for _name, px, _pid in paths:  # warm-up: leaves, pools, connections (1 s; a --quick round's length)
        for c in a.conc:
            hey(direct if px is None else url, px, c, duration=min(1.0, a.duration))
    for r in range(a.rounds):
        for c in a.conc:
            for name, px, pid in paths[r % len(paths) :] + paths[: r % len(paths)]:
                c0, j0 = cpu_seconds(pid) if pid else 0.0, cpu_jiffies()
                run = hey(direct if px is None else url, px, c, duration=a.duration)
                rps, us = run.rps, 1e6 * (cpu_seconds(pid) - c0) / max(run.ok, 1) if pid else float("nan")
                busy, s = busy_share(j0, cpu_jiffies()), got[c]
                s.setdefault(f"{name} rps", []).append(rps)
                s.setdefault(f"{name} us", []).append(us)
                s.setdefault(f"{name} busy", []).append(busy)
                log(f"round {r + 1} c={c} {name}: {rps:.0f} req/s, {us:.0f} µs/req, {busy:.0%} busy")
    return got


def report(a: argparse.Namespace, got: dict[int, Sample], names: list[str]) -> str:
    rows = []
    for c in a.conc:
        s = got[c]
        for n in names:
            vs = [x / y for x, y in zip(s[f"{n} rps"], s["direct rps"], strict=True)]
            us = s[f"{n} us"]
            vf = [x / y for x, y in zip(us, s["floor us"], strict=True)] if n != "direct" else []
            rows.append([c, n, spread(s[f"{n} rps"]), spread(vs, 2) if n != "direct" else "",
                         spread(us) if n != "direct" else "", spread(vf, 2) if vf else "",
                         f"{statistics.median(s[f'{n} busy']):.0%}"])  # fmt: skip
    head = ["conc", "path", "req/s median (range)", "vs direct, per round", "proxy CPU µs/req",
            "CPU vs floor, per round", "both cores busy"]  # fmt: skip
    return (f"Small GETs (/size/1024), hey keep-alive, {a.rounds} rounds x {a.duration:g} s, "
            f"interleaved\n\n" + table(head, rows))  # fmt: skip


def throughput(a: argparse.Namespace) -> str:
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = common.start_upstream(b, certs)
        fl = start_floor(b, up, certs, a.rounds * len(a.conc) * 3 * (a.duration + 3) + 120)
        pp = common.start_politeproxy(b, up, common.PACING_OFF)
        paths = [("direct", None, None), ("floor", fl.url, fl.pid), ("politeproxy", pp.url, pp.pid)]
        direct = f"https://127.0.0.1:{up.port}/size/1024"
        got = measure_paths(a, paths, f"https://{DATA_HOST}/size/1024", direct)
    return report(a, got, [n for n, _, _ in paths])


async def ctl(port: int, path: str) -> int:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    n = int((await r.read()).split(b"\r\n\r\n", 1)[1])
    w.close()
    return n


async def one_client(port: int, ctx: ssl.SSLContext, path: bytes, sem: asyncio.Semaphore) -> str:
    """CONNECT, TLS, one GET; the answer's status (or the error's name)."""
    try:
        async with sem:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % ((DATA_HOST.encode(),) * 2))
            await r.readuntil(b"\r\n\r\n")
            await w.start_tls(ctx, server_hostname=DATA_HOST)
            w.write(b"GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, DATA_HOST.encode()))
        head = await r.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length:\s*(\d+)", head)
        await r.readexactly(int(length.group(1)) if length else 0)
        w.close()
        return head.split(b" ", 2)[1].decode()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError) as e:
        return type(e).__name__


async def hold(a: argparse.Namespace, port: int, pid: int, ca: Path) -> list[list[object]]:
    ctx = ssl.create_default_context(cafile=str(ca))
    sem = asyncio.Semaphore(200)
    assert await one_client(port, ctx, b"/size/100", sem) == "200"  # warm: leaf context, upstream pool
    await asyncio.sleep(1.0)
    idle, t0 = rss_mib(pid), time.monotonic()
    tasks = [asyncio.ensure_future(one_client(port, ctx, b"/hold/size/100", sem)) for _ in range(a.held)]
    held, last, since = 0, -1, time.monotonic()
    while held < a.held and time.monotonic() - since < 20:  # stop when all held or no progress for 20 s
        await asyncio.sleep(0.25)
        held = await ctl(port, "/__held")
        last, since = (held, time.monotonic()) if held != last else (last, since)
    peak, t_peak = rss_mib(pid), time.monotonic() - t0
    await ctl(port, "/__release")
    answers: dict[str, int] = {}
    for st in await asyncio.wait_for(asyncio.gather(*tasks), 120):
        answers[st] = answers.get(st, 0) + 1
    got = ", ".join(f"{k}: {v}" for k, v in sorted(answers.items()))
    per = (peak - idle) * 1024 / held if held else float("nan")
    log(f"held {held} after {t_peak:.1f} s: RSS {idle:.1f} -> {peak:.1f} MiB, {per:.1f} KiB per held request")
    return [["held requests (asked)", f"{held:,} ({a.held:,})"], ["seconds to the peak", f"{t_peak:.1f}"],
            ["floor RSS idle MiB", f"{idle:.1f}"], ["floor RSS at the peak MiB", f"{peak:.1f}"],
            ["floor VmHWM MiB", f"{common.hwm_mib(pid):.1f}"], ["KiB per held request", f"{per:.1f}"],
            ["answers after release", got]]  # fmt: skip


def held_mode(a: argparse.Namespace) -> str:
    import uvloop

    raise_nofile()
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = common.start_upstream(b, certs)
        fl = start_floor(b, up, certs, 600)
        pid, port = fl.pid, fl.port
        rows = uvloop.run(asyncio.wait_for(hold(a, port, pid, certs.ca_file), 480))
    return f"Floor probe holding {a.held:,} HTTPS requests (one process of clients)\n\n" + table(
        ["measure", "value"], rows)  # fmt: skip


def bulk_mode(a: argparse.Namespace) -> str:
    """One ``a.bulk``-byte download with curl per path and round (rotated): MB/s and proxy CPU per GiB."""
    with Bench() as b:
        certs = make_certs(b.tmp)
        up = common.start_upstream(b, certs)
        fl = start_floor(b, up, certs, a.rounds * 3 * 60 + 120)
        paths = [
            ("direct", None),
            ("floor", fl),
            ("politeproxy", common.start_politeproxy(b, up, common.PACING_OFF)),
        ]
        url = f"https://{DATA_HOST}/size/{a.bulk}"
        got: Sample = {}
        for r in range(a.rounds):
            for name, px in paths[r % 3 :] + paths[: r % 3]:
                c0 = cpu_seconds(px.pid) if px else 0.0
                speed = curl_download(url, a.bulk, px.ca_file if px else certs.ca_file, px, up.port)
                cpu = (cpu_seconds(px.pid) - c0) * (1 << 30) / a.bulk if px else float("nan")
                got.setdefault(f"{name} MB/s", []).append(speed / 1e6)
                got.setdefault(f"{name} cpu", []).append(cpu)
                log(f"bulk round {r + 1} {name}: {speed / 1e6:.0f} MB/s, proxy CPU {cpu:.2f} s per GiB")
    rows = []
    for name, px in paths:
        speeds = got[f"{name} MB/s"]
        vs = [x / y for x, y in zip(speeds, got["direct MB/s"], strict=True)]
        rows.append(
            [name, spread(speeds), spread(vs, 2) if px else "", spread(got[f"{name} cpu"], 2) if px else ""]
        )
    head = ["path", "MB/s median (range)", "vs direct, per round", "proxy CPU s per GiB"]
    return f"One {a.bulk / (1 << 20):,.0f} MiB download (curl), {a.rounds} rounds, rotated\n\n" + table(
        head, rows
    )


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--conc", default="1,16,64")
    p.add_argument("--held", type=int, nargs="?", const=2000, default=0, help="held-memory mode, N clients")
    p.add_argument("--bulk", type=int, nargs="?", const=1 << 30, default=0, help="bulk mode, N bytes")
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.duration, a.conc, a.held = 1, 0.5, "1,4", min(a.held, 20)
        a.bulk = min(a.bulk, 8 << 20)
    a.conc = [int(x) for x in a.conc.split(",")]
    text = held_mode(a) if a.held else bulk_mode(a) if a.bulk else throughput(a)
    out = f"Machine: {common.machine_note()}\n\n{text}"
    print(out)
    return out


if __name__ == "__main__":
    main()
