"""Figure 4: 10,000 paced requests held at once: the proxy's RSS and grant lateness.

``.venv/bin/python bench/held.py`` starts politeproxy with a short global gap (default 1 ms) and a large
``pacing.max_wait``, makes the fake upstream answer the first paced request with ``503 Retry-After: S`` so
the host backs off, and opens N client connections (default 10,000; one paced GET each, in its own client
process). Every request is then held in the proxy's queue at once; the RSS is read when all N are queued.
When the backoff ends they drain at the configured gap. Grant lateness comes from the proxy's
``politeproxy_grant_lateness_seconds`` histogram and, independently, from the fake upstream's arrival log
(arrival time against the ideal schedule first + i * gap).

``--scheme https`` (default) sends every request through CONNECT and TLS, as real clients do; ``http``
uses absolute-form plain HTTP requests (``HTTP_PROXY``), which costs the proxy no TLS state.

"KiB per held request" is (RSS at the peak queue - idle RSS) / peak queued. ``--candidate DIR`` measures
politeproxy run from another source tree too, alternating (ABBA over ``--rounds``), and reports that
figure for both trees side by side with the ratio per round pair (issue 15, memory per held connection).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PY,
    ROOT,
    WINDOW_OFF,
    Bench,
    Proxy,
    bucket_diff,
    bucket_quantile,
    fmt,
    hist_buckets,
    hwm_mib,
    log,
    machine_note,
    make_certs,
    percentile,
    rss_mib,
    start_politeproxy,
    start_upstream,
    table,
)
from tests.support.measure import achieved_rate  # noqa: E402

CLIENT = r"""
import asyncio, json, ssl, sys, time
import aiohttp

url, proxy, ca, n, procs_idx = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

async def main():
    ctx = ssl.create_default_context(cafile=ca)
    conn = aiohttp.TCPConnector(limit=0, ssl=ctx, force_close=True)
    timeout = aiohttp.ClientTimeout(total=300)
    statuses = {}
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        async def one(i):
            try:
                async with s.get(f"{url}?c={procs_idx}&i={i}", proxy=proxy) as r:
                    await r.read()
                    return r.status
            except Exception as e:
                return type(e).__name__
        sem = asyncio.Semaphore(200)  # pace connection set-up, not the requests
        async def gated(i):
            async with sem:
                t = asyncio.ensure_future(one(i))
                await asyncio.sleep(0)
            return await t
        for st in await asyncio.gather(*(gated(i) for i in range(n))):
            statuses[str(st)] = statuses.get(str(st), 0) + 1
    print(json.dumps(statuses))

asyncio.run(main())
"""


def healthz(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as r:
        return dict(json.loads(r.read()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny run for the smoke test")
    p.add_argument("-n", type=int, default=10_000, help="requests held at once")
    p.add_argument("--gap", type=float, default=0.001, help="global gap in seconds")
    p.add_argument("--clients", type=int, default=2, help="client processes")
    p.add_argument("--scheme", choices=("https", "http"), default="https")
    p.add_argument("--store", choices=("memory", "file"), default="file")
    p.add_argument("--hold", type=float, default=0.0, help="Retry-After seconds (0: derived from -n)")
    p.add_argument("--candidate", type=Path, help="also measure politeproxy run from this source tree")
    p.add_argument(
        "--tracemalloc",
        action="store_true",
        help="run the proxy under tracemalloc (bench/traced_run.py) and add its Python allocations per held"
        " request by area (tracemalloc's own bookkeeping inflates the RSS figures of such a run)",
    )
    p.add_argument(
        "--trim-probe",
        action="store_true",
        help="with --accounts: malloc_trim(0) at the peak's snapshot, and the RSS it gave back (a probe: the"
        " RSS read after the peak is then lower than the proxy's own)",
    )
    p.add_argument("--top", type=int, default=0, help="with --tracemalloc: also list the N biggest lines")
    p.add_argument("--rounds", type=int, default=1, help="with --candidate: round pairs (ABBA)")
    p.add_argument(
        "--accounts",
        action="store_true",
        help="run the proxy under bench/traced_run.py (without tracemalloc unless asked) and add where its"
        " memory grew per held request: RSS, malloc's heap (used, free), mmapped chunks, pymalloc's arenas",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.clients = 200, 1
    return a


def hold_all(
    a: argparse.Namespace,
    pp: Proxy,
    url: str,
    held: Callable[[], int],
    at_peak: Callable[[], None] = lambda: None,
    still: list[tuple[int, float]] | None = None,
) -> tuple[dict[str, int], int, float, float]:
    """Run the clients (``a.n`` GETs of ``url`` through ``pp``); (answers by status, peak held, RSS at the
    peak, seconds to the peak). ``held()`` counts the requests held now (politeproxy's queue; for Squid,
    bench/beside_squid.py counts those in flight at the upstream). ``at_peak`` runs once, at 95 % of a.n.
    ``still`` gets (held, RSS) of the last look while 98 % of the peak were still held: the RSS a proxy keeps
    while it holds them, after the burst of connections that brought them."""
    per = [a.n // a.clients + (1 if i < a.n % a.clients else 0) for i in range(a.clients)]
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [PY, "-c", CLIENT, url, pp.url, str(pp.ca_file), str(k), str(i)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, k in enumerate(per)
    ]
    peak_queued, rss_full, t_full, told = 0, float("nan"), float("nan"), False
    while any(pr.poll() is None for pr in procs):
        q = held()
        if q > peak_queued:
            peak_queued, rss_full, t_full = q, rss_mib(pp.pid), time.monotonic() - started
        if not told and q >= 0.95 * a.n:
            told = True
            at_peak()
        if still is not None and q >= 0.98 * peak_queued > 0:
            still[:] = [(q, rss_mib(pp.pid))]
        time.sleep(0.05)
    log(f"held: peak {peak_queued} held after {t_full:.1f} s, RSS then {rss_full:.1f} MiB")
    statuses: dict[str, int] = {}
    for pr in procs:
        out, _ = pr.communicate()
        for k, v in json.loads(out.strip().splitlines()[-1]).items():
            statuses[k] = statuses.get(k, 0) + v
    return statuses, peak_queued, rss_full, t_full


def _drained(arrivals: list[float]) -> list[float]:
    """The arrivals after the backoff: drop what went before the longest gap (the throttled request and
    any granted with it)."""
    if len(arrivals) < 2:
        return arrivals
    cut = max(range(1, len(arrivals)), key=lambda i: arrivals[i] - arrivals[i - 1])
    return arrivals[cut:]


def kib_per_held(rss_full: float, idle: float, queued: int) -> float:
    return (rss_full - idle) * 1024 / queued if queued else float("nan")


def _compare(a: argparse.Namespace) -> str:
    """Both trees, alternating, one proxy at a time: KiB per held request each and their ratio, at the
    peak and at the last look before the drain (still held, after the burst of connections)."""
    rows, ratios = [], []
    for r in range(a.rounds):
        order = [None, a.candidate] if r % 2 == 0 else [a.candidate, None]
        got = {str(src): measure(a, src) for src in order}
        base, cand = got["None"], got[str(a.candidate)]
        ratios.append(cand.per_held / base.per_held)
        rows.append(
            [
                str(r + 1),
                fmt(base.per_held, 1),
                fmt(cand.per_held, 1),
                fmt(cand.per_held / base.per_held, 3),
                fmt(base.still_held, 1),
                fmt(cand.still_held, 1),
            ]
        )
    ratios.sort()
    rows.append(["median", "", "", fmt(ratios[len(ratios) // 2], 3), "", ""])
    head = f"### KiB per held request, {a.n:,} held ({a.scheme}): this tree against {a.candidate}\n\n"
    cols = ["round", "this tree", "candidate", "candidate / this", "this, still held", "candidate, still"]
    return head + table(cols, rows)


def main(argv: list[str] | None = None) -> str:
    a = parse_args(argv)
    if a.candidate is not None:
        text = f"Machine: {machine_note()}\n\n" + _compare(a)
        print(text)
        return text
    text = measure(a, None).text
    print(text)
    return text


class Held(NamedTuple):
    """One proxy's held figure: the report, KiB per held request, and the facts it was made of."""

    text: str
    per_held: float
    answers: str  # "status: count, ..."
    peak: int  # requests held at the peak
    idle_rss: float  # MiB
    peak_rss: float  # MiB, when the most were held
    still_held: float = float("nan")  # KiB per held request at the last look before the drain


def hold_seconds(a: argparse.Namespace) -> float:
    """How long the upstream holds its answers: long enough for every client connection to be made (TLS
    handshakes dominate on 2 cores)."""
    return float(a.hold or max(3.0, a.n / 1000 * (5.5 if a.scheme == "https" else 1.5)))


def measure(a: argparse.Namespace, src: Path | None) -> Held:
    """One proxy (from ``src``, default this tree) holding ``a.n`` requests."""
    hold = hold_seconds(a)
    with Bench() as b:
        up = start_upstream(b, make_certs(b.tmp))
        toml = (
            f'[schedule]\nglobal_rate = "{a.gap * 1000:g}ms"\nbackend = "{a.store}"\n'
            # The drain at the configured gap is what this figure measures; the adaptive interval (on by
            # default) would slow the host to 1 req/s after the 503: bench/storm.py measures that instead.
            # max_queue and client.max_connections: their defaults (1,024; 4,096) would refuse the rest.
            f'[pacing]\nmax_wait = "300s"\nretries = 2\nadaptive = false\nmax_queue = {a.n + 100}\n'
            f'[client]\nheader_timeout = "300s"\nidle_timeout = "300s"\nmax_connections = {a.n + 100}\n'
            # The request window (issue 24) would close after 4,800 of the 10,000 and hold the rest past
            # the clients' timeout: the drain measured is the gap's, so the window is off.
            + WINDOW_OFF
        )
        trace = b.tmp / "tracemalloc.txt"
        wrapped = a.tracemalloc or a.accounts
        if wrapped:
            os.environ["POLITEPROXY_TRACE_OUT"] = str(trace)  # read by bench/traced_run.py only
            os.environ["POLITEPROXY_TRACEMALLOC"] = "1" if a.tracemalloc else "0"
            os.environ["POLITEPROXY_TRACE_TRIM"] = "1" if a.trim_probe else "0"
        module = "bench.traced_run" if wrapped else "politeproxy"
        pp = start_politeproxy(b, up, toml, src=src, module=module)
        idle_rss = rss_mib(pp.pid)
        queued = lambda: int(healthz(pp.port).get("queued", 0))  # noqa: E731
        at_snapshot: list[int] = []

        def snapshot() -> None:
            if wrapped:
                at_snapshot.append(queued())
                os.kill(pp.pid, signal.SIGUSR2)

        snapshot()  # the base, idle
        # One throttled answer puts the host in backoff for `hold` seconds: everything after it queues.
        up.control({"throttle": {"host": DATA_HOST, "count": 1, "status": 503, "retry_after": f"{hold:g}"}})
        before = hist_buckets(pp.metrics(), "politeproxy_grant_lateness_seconds")
        url = f"{a.scheme}://{DATA_HOST}/size/100"
        still: list[tuple[int, float]] = []
        statuses, peak_queued, rss_full, _t = hold_all(a, pp, url, queued, snapshot, still)
        peak = hwm_mib(pp.pid)
        diff = bucket_diff(hist_buckets(pp.metrics(), "politeproxy_grant_lateness_seconds"), before)
        h50, h99 = bucket_quantile(diff, 0.5), bucket_quantile(diff, 0.99)
        drained = _drained(sorted(e["t"] for e in up.log() if e["path"].startswith("/size/100")))
        late = [t - (drained[0] + i * a.gap) for i, t in enumerate(drained)]
        achieved = achieved_rate(drained) if len(drained) > 1 else float("nan")
        per_held = kib_per_held(rss_full, idle_rss, peak_queued)
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
        log(f"{src or 'this tree'}: {per_held:.1f} KiB per held request")
        rows = [
            ["requests (client processes)", f"{a.n:,} ({a.clients}, {a.scheme})"],
            ["answers", answers],
            ["peak queued (/healthz)", f"{peak_queued:,}"],
            ["proxy RSS idle MiB", fmt(idle_rss, 1)],
            ["proxy RSS at peak queue MiB", fmt(rss_full, 1)],
            ["proxy peak RSS MiB (VmHWM)", fmt(peak, 1)],
            ["KiB per held request (RSS at peak - idle) / queued", fmt(per_held, 1)],
            ["proxy RSS while held, last look before the drain MiB", fmt(still[0][1], 1) if still else "-"],
            [
                "KiB per held request then ((RSS - idle) / queued)",
                fmt(kib_per_held(still[0][1], idle_rss, still[0][0]), 1) if still else "-",
            ],
            ["grant lateness p50 / p99 ms (histogram)", f"{fmt(h50 * 1e3, 2)} / {fmt(h99 * 1e3, 2)}"],
            [
                "arrival vs ideal schedule p50 / p99 ms",
                f"{fmt(percentile(late, 50) * 1e3, 2)} / {fmt(percentile(late, 99) * 1e3, 2)}",
            ],
            ["drained after backoff", f"{len(drained):,}"],
            ["drain achieved/configured", fmt(achieved * a.gap, 4)],
        ]
        text = (
            f"Machine: {machine_note()}\n\n### {a.n:,} paced requests held at once "
            f"(gap {a.gap * 1e3:g} ms, store {a.store}, {a.scheme})\n\n" + table(["measure", "value"], rows)
        )
        if a.tracemalloc:
            text += "\n\n" + traced_areas(trace, peak_queued)
            if a.top and trace.exists():
                top = trace.read_text().splitlines()[: a.top]
                listed = "\n".join(f"    {t}" for t in top)
                text += "\n\nBiggest lines (bytes, allocations, where):\n\n" + listed
        if wrapped:
            text += "\n\n" + memory_accounts(trace.with_name(trace.name + ".mem"), at_snapshot)
    still_per = kib_per_held(still[0][1], idle_rss, still[0][0]) if still else float("nan")
    return Held(text, per_held, answers, peak_queued, idle_rss, rss_full, still_per)


# Where a Python allocation was made, by the file that made it: the first area with a marker in its path.
TLS_BUFFERS = "aiofastnet's TLS buffers (2 x 263 KiB bytearrays a connection, mostly never touched)"
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (TLS_BUFFERS, ("api_start_tls.py",)),
    ("aiofastnet's transports (socket and TLS transport objects)", ("/aiofastnet/",)),
    ("politeproxy: the intercepted connection (h1server, served)", ("h1server.py", "served.py")),
    ("politeproxy: the exchange (forward; upstream: the headers copy)", ("forward.py", "upstream.py")),
    ("politeproxy: the front door (listener, front, routing)", ("listener.py", "front.py", "routing.py")),
    ("politeproxy: the pacer's wait (pacing/)", ("/pacing/",)),
    ("politeproxy: the rest", ("/politeproxy/",)),
    ("asyncio: tasks, timeouts, coroutine frames", ("/asyncio/", "_weakrefset.py")),
    ("yarl and multidict: the request's URL", ("/yarl/", "/multidict/")),
)


ACCOUNTS = (
    ("VmRSS", "resident set (VmRSS)"),
    ("RssAnon", "of it anonymous (RssAnon)"),
    ("pymalloc_arena_bytes", "pymalloc's arenas (small Python objects; mapped by Python, outside malloc)"),
    ("pymalloc_used_bytes", "of them in allocated blocks"),
    ("malloc_heap", "malloc's heap taken from the system (all arenas, not mmapped chunks)"),
    ("malloc_used", "of it in use (OpenSSL's state, Python's buffers and objects over 512 bytes)"),
    ("malloc_free", "of it free (malloc's slack: resident where it was touched before)"),
    ("malloc_mmapped", "malloc's mmapped chunks (resident only where touched)"),
)


def memory_accounts(mem: Path, held_at: list[int]) -> str:
    """bench/traced_run.py's accounts at idle and at the peak: their growth per held request (KiB)."""
    lines = mem.read_text().splitlines() if mem.exists() else []
    if len(lines) < 2 or len(held_at) < 2 or held_at[1] <= held_at[0]:
        return "memory accounts: no snapshot at the peak was written"
    base, peak = json.loads(lines[0]), json.loads(lines[-1])
    held = held_at[-1] - held_at[0]
    rows = [
        [label, fmt((peak[k] - base[k]) / 1024 / held, 2)] for k, label in ACCOUNTS if k in base and k in peak
    ]
    if "VmRSS_after_trim" in peak:
        back = (peak["VmRSS"] - peak["VmRSS_after_trim"]) / 1024 / held
        rows.append(["given back by malloc_trim(0) at the peak (whole free pages)", fmt(back, 2)])
    rows.append(["mmapped chunks at the peak (count)", f"{peak.get('malloc_mmapped_chunks', 0):,}"])
    return f"### Memory accounts: growth per held request ({held:,} held at the snapshot)\n\n" + table(
        ["account", "KiB per held request"], rows
    )


def traced_areas(trace: Path, held: int) -> str:
    """bench/traced_run.py's growth between idle and the peak, as KiB per held request by area."""
    if not trace.exists() or not held:
        return "tracemalloc: no snapshot was written"
    kib: dict[str, float] = {}
    for line in trace.read_text().splitlines():
        size, _count, path = line.split(" ", 2)
        name = next((n for n, marks in AREAS if any(m in path for m in marks)), "other")
        kib[name] = kib.get(name, 0.0) + int(size) / 1024 / held
    python = sum(v for k, v in kib.items() if k != TLS_BUFFERS)
    rows = [[k, fmt(v, 2)] for k, v in sorted(kib.items(), key=lambda kv: -kv[1])]
    rows.append(["Python allocations but the TLS buffers, in all", fmt(python, 2)])
    return f"### Python allocations per held request (tracemalloc, {held:,} held)\n\n" + table(
        ["area", "KiB per held request"], rows
    )


if __name__ == "__main__":
    main()
