"""Plain clients of the index server through a proxy's CONNECT tunnel (issue 43's tests): one GET as a named
pipeline (http.client), and the index requests of the fake upstream's arrival log."""

from __future__ import annotations

import base64
import functools
import http.client
import ssl
import urllib.parse

from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Upstream

IX = "index.commoncrawl.org"
CRAWL = "CC-MAIN-2024-20"  # listed in the fake collinfo.json


@functools.cache
def client_tls(cafile: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile)


def get(p: ProxyProc, target: str, pipeline: str = "plain") -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers of GET https://index.commoncrawl.org<target> through p, as ``pipeline``."""
    proxy = urllib.parse.urlsplit(p.url)
    c = http.client.HTTPSConnection(
        proxy.hostname or "", proxy.port, context=client_tls(p.env["SSL_CERT_FILE"]), timeout=30
    )
    auth = base64.b64encode(f"{pipeline}:x".encode()).decode()
    try:
        c.set_tunnel(IX, 443, headers={"Proxy-Authorization": f"Basic {auth}"})
        c.request("GET", target)
        r = c.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        c.close()


def index_arrivals(up: Upstream, path: str = "") -> list[str]:
    return [str(a["path"]) for a in up.log() if a["host"] == IX and str(a["path"]).startswith(path)]


def question(domain: str, crawl: str = CRAWL) -> str:
    return f"/{crawl}-index?url={domain}/*&output=json"
