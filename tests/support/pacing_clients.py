"""Client processes and single requests through a proxy's CONNECT tunnels, for measuring the schedule.

Clients are real processes using the environment ``politeproxy env`` prints (HTTPS_PROXY, SSL_CERT_FILE):
each opens its CONNECT tunnels first, says "ready", and fires only when every client is ready, so the
start-up cost of processes and TLS handshakes is not mistaken for pacing error, and enough requests are in
flight that the queue never drains.
"""

from __future__ import annotations

import http.client
import json
import struct
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT
from tests.support.tlsclient import client_context

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
    ctx = client_context(env["SSL_CERT_FILE"])
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
