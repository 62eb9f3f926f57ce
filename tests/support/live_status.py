"""A running proxy with paced requests from two pipelines queued behind a 1 s gap, for the status tests
(``GET /status``, ``politeproxy status``, the page at ``/`` and its browser test).

The pipelines are named as users name them, by the proxy URL's user name (Proxy-Authorization); the
requests are plain HTTP in absolute form, sent and left waiting on their sockets.
"""

from __future__ import annotations

import base64
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.support.processes import free_port, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.upstream_proc import Certs, Upstream, start_upstream

D = "data.commoncrawl.org"


GAP = 1.0  # seconds between grants: the lines stay queued for the whole module


QUEUED = {"alpha": 8, "beta": 5}  # requests sent per pipeline: 13 s of slots, longer than the module


CONFIG = (
    f'{NO_ROBOTS}[schedule]\nbackend = "memory"\nglobal_rate = "{GAP:g}s"\n'
    '[pacing]\nmax_wait = "60s"\n[pipelines.alpha]\nweight = 2\n'
)


@dataclass
class Live:
    proxy: ProxyProc
    upstream: Upstream
    side: str  # the --metrics-listen URL
    sockets: list[socket.socket]

    def status(self, base: str | None = None) -> dict[str, Any]:
        r = requests.get((base or self.proxy.url) + "/status", timeout=10)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("application/json")
        return dict(r.json())


def send_paced(port: int, pipeline: str, path: str) -> socket.socket:
    """One paced request of ``pipeline``, sent and left waiting (the caller closes the socket)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    auth = base64.b64encode(f"{pipeline}:".encode()).decode()
    s.sendall(
        f"GET http://{D}{path} HTTP/1.1\r\nHost: {D}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    return s


def start_live(tmp: Path, certs: Certs) -> Live:
    up = start_upstream(certs, tmp)
    side_port = free_port()
    p = start_proxy(
        tmp,
        up,
        certs,
        CONFIG,
        args=("--metrics-listen", f"127.0.0.1:{side_port}"),
        env={"POLITEPROXY_STATUS_STEP": "0.5"},
    )
    live = Live(p, up, f"http://127.0.0.1:{side_port}", [])
    for name, n in QUEUED.items():
        live.sockets += [send_paced(p.port, name, f"/p/{name}/{i}") for i in range(n)]
    total = sum(QUEUED.values())
    # One request goes at once (the first slot); the others wait at least a gap.
    wait_for(lambda: live.status()["overall"]["queued"] >= total - 2, 15, "requests queued")
    # and the first slot granted (on a loaded box every request can be queued before the first grant)
    wait_for(lambda: live.status()["overall"]["grants_since_start"] >= 1, 15, "the first grant")
    return live


def stop_live(live: Live) -> None:
    for s in live.sockets:
        s.close()
    live.proxy.stop()
    live.upstream.stop()
