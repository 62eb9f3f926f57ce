"""Loads for the request-window tests (tests/e2e/test_request_window.py, tests/faults/test_window_faults.py):
keep-alive clients through a proxy, paced and exempt, sending without pause; the arrivals counted from the
fake upstream's log."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.support.measure import busiest_window
from tests.support.upstream_proc import Upstream

DATA = "data.commoncrawl.org"
TABLE = "/cc-index/table/cc-main/warc/part-0.parquet"  # a range read here is exempt by the default rule


@dataclass
class Answer:
    klass: str  # "paced" or "exempt"
    status: int
    body: bytes


def _client(
    env: dict[str, str],
    klass: str,
    n: int,
    stop: float,
    out: list[Answer],
    lock: threading.Lock,
    host: str = DATA,
) -> None:
    """One keep-alive tunnel through the proxy in ``env``, sending requests of ``klass`` without pause
    until ``stop``. A refused request (503) comes back after 0.25 s, as a client that retries soon."""
    proxy = urllib.parse.urlsplit(env["HTTPS_PROXY"])
    ctx = ssl.create_default_context(cafile=env["SSL_CERT_FILE"])
    conn = http.client.HTTPSConnection(proxy.hostname or "127.0.0.1", proxy.port, context=ctx, timeout=60)
    conn.set_tunnel(host, 443)
    i = 0
    try:
        while time.monotonic() < stop:
            if klass == "exempt":
                path, headers = f"{TABLE}?r={n}-{i}", {"Range": f"bytes={i}-{i + 9}"}
            else:
                path, headers = f"/size/64?p={n}-{i}", {}
            i += 1
            try:
                conn.request("GET", path, headers=headers)
                r = conn.getresponse()
                body = r.read()
            except (OSError, http.client.HTTPException):
                conn.close()  # http.client opens the tunnel again on the next request
                continue
            with lock:
                out.append(Answer(klass, r.status, body))
            if r.status == 503:
                time.sleep(0.25)
    finally:
        conn.close()


def load(
    envs: list[dict[str, str]], seconds: float, paced: int, exempt: int, hosts: tuple[str, ...] = (DATA,)
) -> list[Answer]:
    """``paced`` paced clients and ``exempt`` exempt clients per proxy and host, all at once, for
    ``seconds``."""
    stop = time.monotonic() + seconds
    out: list[Answer] = []
    lock = threading.Lock()
    kinds = ["paced"] * paced + ["exempt"] * exempt
    jobs = [(env, k, h) for env in envs for h in hosts for k in kinds]
    with ThreadPoolExecutor(len(jobs)) as ex:
        futs = [ex.submit(_client, env, k, n, stop, out, lock, h) for n, (env, k, h) in enumerate(jobs)]
        for f in futs:
            f.result(seconds + 90)
    return out


def data_arrivals(up: Upstream) -> list[float]:
    return sorted(a["t"] for a in up.log() if a["host"] == DATA)


def trailing(ts: list[float], seconds: float) -> tuple[float, int]:
    """The busiest closed window of ``seconds`` (start, count)."""
    return busiest_window(ts, seconds + 1e-9)
