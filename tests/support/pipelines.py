"""Pieces the pipeline tests share: a paced config with a max_wait, and a metric's samples by name."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.proxy_proc import NO_ROBOTS, ProxyProc

D = "data.commoncrawl.org"


Factory = Callable[..., ProxyProc]


def config(gap: float, max_wait: float = 25.0, extra: str = "") -> str:
    schedule = f'[schedule]\nbackend = "memory"\nglobal_rate = "{gap}s"\n'
    return f'{NO_ROBOTS}{schedule}[pacing]\nmax_wait = "{max_wait}s"\n{extra}'


def metric_lines(p: ProxyProc, name: str) -> list[str]:
    return [line for line in p.metrics().splitlines() if line.startswith(name + "{")]
