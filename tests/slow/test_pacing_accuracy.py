"""Accuracy of the global schedule, measured from the fake upstream's arrival log at a 20 ms gap.

Clients are real processes using the environment ``politeproxy env`` prints (HTTPS_PROXY, SSL_CERT_FILE):
each opens its CONNECT tunnels first, says "ready", and fires only when every client is ready, so the
start-up cost of processes and TLS handshakes is not mistaken for pacing error, and enough requests are in
flight that the queue never drains.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import struct
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import NO_ROBOTS, ROOT, ProxyProc, Upstream

GAP = 0.02
RATE = 1 / GAP
PACED_20MS = NO_ROBOTS + '[schedule]\nglobal_rate = "20ms"\n'

# A client: `conc` keep-alive tunnels through HTTPS_PROXY, then `n` GETs shared among them.
CLIENT = r"""
import http.client, json, os, ssl, sys, threading, time, urllib.parse
host, n, conc, prefix, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
method = sys.argv[6] if len(sys.argv) > 6 else "GET"
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
conns = []
for _ in range(conc):
    c = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=ctx, timeout=120)
    c.set_tunnel(host, 443)
    c.connect()
    conns.append(c)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
lock = threading.Lock()
todo = list(range(n))
out = []
def work(c):
    while True:
        with lock:
            if not todo:
                return
            i = todo.pop(0)
        sep = "&" if "?" in prefix else "?"
        c.request(method, f"{prefix}{sep}i={i}&pid={os.getpid()}")
        r = c.getresponse()
        body = r.read()
        with lock:
            out.append({"i": i, "status": r.status, "t": time.time(),
                        "retry_after": r.getheader("Retry-After"), "body": body[:200].decode("latin-1")})
ts = [threading.Thread(target=work, args=(c,)) for c in conns]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out), flush=True)
"""


@dataclass
class ClientRun:
    procs: list[subprocess.Popen[str]]
    go: Path

    def fire(self) -> None:
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", f"client did not get ready: {line!r}"
        self.go.write_text("go")

    def results(self, timeout: float = 120) -> list[list[dict[str, Any]]]:
        out = []
        for p in self.procs:
            stdout, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"client failed ({p.returncode})"
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out


def start_clients(
    envs: Sequence[dict[str, str]],
    host: str,
    n: int,
    conc: int,
    prefix: str,
    tmp: Path,
    method: str = "GET",
) -> ClientRun:
    """One client process per env, all waiting on one go-file."""
    go = tmp / f"go-{time.monotonic_ns()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, host, str(n), str(conc), prefix, str(go), method],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for env in envs
    ]
    return ClientRun(procs, go)


def tunnel_get(
    env: dict[str, str], host: str, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    """One request through the proxy in ``env`` (HTTPS_PROXY, SSL_CERT_FILE), from this process."""
    proxy = urllib.parse.urlsplit(env["HTTPS_PROXY"])
    ctx = ssl.create_default_context(cafile=env["SSL_CERT_FILE"])
    c = http.client.HTTPSConnection(proxy.hostname or "127.0.0.1", proxy.port, context=ctx, timeout=60)
    try:
        c.set_tunnel(host, 443)
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def warm_upstream_pool(env: dict[str, str], host: str = "data.commoncrawl.org", n: int = 3) -> None:
    """Open the proxy's upstream connections with exempt range reads, which take no slot.

    The first paced requests would otherwise pay the proxy's TLS handshakes to the upstream, arrive late
    and make the measured span look shorter than the schedule's.
    """
    with ThreadPoolExecutor(n) as ex:
        got = list(
            ex.map(
                lambda i: tunnel_get(env, host, f"/cc-index/table/warm{i}", {"Range": "bytes=0-0"}), range(n)
            )
        )
    assert all(status < 400 for status, _, _ in got)


def run_clients(
    envs: Sequence[dict[str, str]], host: str, n: int, conc: int, prefix: str, tmp: Path
) -> list[list[dict[str, Any]]]:
    run = start_clients(envs, host, n, conc, prefix, tmp)
    run.fire()
    return run.results()


@dataclass
class Stats:
    n: int
    rate: float
    max_window: int
    duration: float


def arrival_stats(times: Sequence[float], window: float = 1.0) -> Stats:
    ts = sorted(times)
    n = len(ts)
    duration = ts[-1] - ts[0] if n > 1 else 0.0
    rate = (n - 1) / duration if duration > 0 else float("inf")
    best, j = 0, 0
    for i in range(n):
        while j < n and ts[j] < ts[i] + window:
            j += 1
        best = max(best, j - i)
    return Stats(n, rate, best, duration)


def read_lock(data_dir: Path) -> tuple[int, int]:
    data = (data_dir / "ratelimit.lock").read_bytes()
    assert len(data) == 16
    return struct.unpack(">QQ", data)


def paced_arrivals(up: Upstream, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    return [a for a in up.log() if pred(a)]


def report(name: str, st: Stats, times: Sequence[float] = ()) -> None:
    # Shown with -s or on failure; the README and the issue quote these numbers.
    ts = sorted(times)
    gaps = sorted(((b - a, i) for i, (a, b) in enumerate(zip(ts, ts[1:], strict=False))), reverse=True)
    widest = " ".join(f"#{i}:{g * 1000:.0f}ms" for g, i in gaps[:4])
    print(
        f"\n{name}: n={st.n} rate={st.rate:.2f}/s ratio={st.rate / RATE:.4f} "
        f"max_1s_window={st.max_window} span={st.duration:.3f}s widest gaps {widest}",
        file=sys.stderr,
    )


def check(st: Stats, n: int) -> None:
    assert st.n == n
    assert abs(st.rate / RATE - 1) <= 0.02, f"combined rate {st.rate:.2f}/s is not within 2% of {RATE:g}/s"
    assert st.max_window <= 53, f"a 1 s window held {st.max_window} requests"


def is_paced_size(a: dict[str, Any]) -> bool:
    return a["host"] == "data.commoncrawl.org" and a["path"].startswith("/size/")


def test_three_clients_through_one_proxy(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    p = proxy_factory(upstream, PACED_20MS)
    warm_upstream_pool(p.env)
    results = run_clients([p.env] * 3, "data.commoncrawl.org", 40, 8, "/size/64", tmp_path)
    assert [r["status"] for rs in results for r in rs].count(200) == 120
    arrivals = paced_arrivals(upstream, is_paced_size)
    st = arrival_stats([a["t"] for a in arrivals])
    report("3 clients x 40 via one proxy", st, [a["t"] for a in arrivals])
    check(st, 120)
    assert len({a["path"] for a in arrivals}) == 120  # each request once: nothing retried or duplicated
    assert read_lock(p.data_dir)[1] == 120


def test_three_proxies_sharing_one_data_dir(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, tmp_path: Path
) -> None:
    data_dir = tmp_path / "shared"
    proxies = [proxy_factory(upstream, PACED_20MS, data_dir=data_dir) for _ in range(3)]
    assert len({p.port for p in proxies}) == 3
    for p in proxies:
        warm_upstream_pool(p.env)
    results = run_clients([p.env for p in proxies], "data.commoncrawl.org", 40, 8, "/size/64", tmp_path)
    assert [r["status"] for rs in results for r in rs].count(200) == 120
    arrivals = paced_arrivals(upstream, is_paced_size)
    st = arrival_stats([a["t"] for a in arrivals])
    report("3 proxies x 40, one data dir", st, [a["t"] for a in arrivals])
    check(st, 120)
    # Every proxy's client got through, interleaved on the one schedule.
    pids = {a["path"].rsplit("pid=", 1)[1] for a in arrivals}
    assert len(pids) == 3
    nxt, count = read_lock(data_dir)
    assert count == 120
    assert nxt / 1e9 >= max(a["t"] for a in arrivals) - 0.5  # the record's next slot follows the last grant
    assert os.path.getsize(data_dir / "ratelimit.lock") == 16
