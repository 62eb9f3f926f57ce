"""Pieces the pipeline tests share: a paced config with a max_wait, a metric's samples by name, a client
environment naming its pipeline, and the arrival log by pipeline."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.upstream_proc import Upstream

D = "data.commoncrawl.org"


Factory = Callable[..., ProxyProc]


def config(gap: float, max_wait: float = 25.0, extra: str = "") -> str:
    schedule = f'[schedule]\nbackend = "memory"\nglobal_rate = "{gap}s"\n'
    return f'{NO_ROBOTS}{schedule}[pacing]\nmax_wait = "{max_wait}s"\n{extra}'


def metric_lines(p: ProxyProc, name: str) -> list[str]:
    return [line for line in p.metrics().splitlines() if line.startswith(name + "{")]


def named(p: ProxyProc, name: str) -> dict[str, str]:
    """The client environment of ``p`` with the pipeline ``name`` in every proxy URL."""
    url = f"http://{name}:@127.0.0.1:{p.port}"  # requests sends no user name without the ':'
    return {**p.env, "HTTPS_PROXY": url, "HTTP_PROXY": url, "https_proxy": url, "http_proxy": url}


def arrivals(up: Upstream, prefix: str = "/p/") -> list[tuple[float, str]]:
    """(time, pipeline) of every arrival whose path is /p/PIPELINE/..., in order."""
    out = [(a["t"], a["path"].split("/")[2]) for a in up.log() if a["path"].startswith(prefix)]
    return sorted(out)
