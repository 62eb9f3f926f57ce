"""The "503 storm" figure of bench/pacing.py (issue 12): a host that serves at most CAPACITY requests a
second and answers 503 SlowDown (no Retry-After) beyond that, behind a proxy configured for more, with the
adaptive interval on and off. Reported from the fake upstream's arrival log: configured rate, requests
that reached the host per second (arrival log), answers served per second and the host's 503s the clients
saw (throttles seen; retries = 0, so each request reaches the host at most once)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.common import Bench, Upstream, fmt, log, start_politeproxy
from tests.support.pacing_clients import tunnel_get

HOST = "data.commoncrawl.org"
CONFIGURED = 20  # req/s the proxy is configured for
CAPACITY = 8  # req/s the host serves; beyond that it answers 503


@dataclass
class StormRow:
    adaptive: bool
    seconds: float
    arrivals: int
    served: int
    throttles: int

    def cells(self) -> list[object]:
        return [
            "on" if self.adaptive else "off",
            CONFIGURED,
            CAPACITY,
            fmt(self.arrivals / self.seconds, 2),
            fmt(self.served / self.seconds, 2),
            self.throttles,
            fmt(self.throttles / max(1, self.arrivals), 3),
        ]


HEADERS = [
    "adaptive",
    "configured req/s",
    "host capacity req/s",
    "reached the host req/s",
    "served (200) req/s",
    "503s seen",
    "503 share",
]


def storm(b: Bench, up: Upstream, adaptive: bool, seconds: float, clients: int = 8) -> StormRow:
    toml = (
        f'[schedule]\nglobal_rate = "{1000 / CONFIGURED:g}ms"\nbackend = "memory"\n'
        f'[pacing]\nmax_wait = "120s"\nretries = 0\nadaptive = {str(adaptive).lower()}\n'
    )
    px = start_politeproxy(b, up, toml)
    env = {"HTTPS_PROXY": px.url, "SSL_CERT_FILE": str(px.ca_file)}
    up.reset()
    up.control({"capacity": {"host": HOST, "per_second": CAPACITY}})
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    answers: dict[str, int] = {}  # "200", "503 upstream", "503 proxy", ...

    def client(n: int) -> None:
        i = 0
        while time.monotonic() < stop:
            status, _, body = tunnel_get(env, HOST, f"/size/10?storm={n}-{i}")
            kind = f"{status} {'proxy' if body.startswith(b'politeproxy:') else 'upstream'}"
            with lock:
                answers[kind] = answers.get(kind, 0) + 1
            i += 1

    start = time.time()
    with ThreadPoolExecutor(clients) as ex:
        for f in [ex.submit(client, n) for n in range(clients)]:
            f.result(seconds * 5 + 120)
    px.proc.terminate()
    arrivals = [e for e in up.log() if e["host"] == HOST and e["t"] >= start and "storm=" in e["path"]]
    span = max(1e-9, min(seconds, max(e["t"] for e in arrivals) - start)) if arrivals else seconds
    row = StormRow(
        adaptive, span, len(arrivals), answers.get("200 upstream", 0), answers.get("503 upstream", 0)
    )
    log(f"503 storm, adaptive {'on' if adaptive else 'off'}: {row.cells()}; answers {answers}")
    return row
