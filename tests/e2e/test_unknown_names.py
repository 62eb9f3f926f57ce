"""Issue 42, item 10: every unknown name under commoncrawl.org is one service with one window.

Names under ``*.commoncrawl.org`` are paced by default, and a client chooses them. Each used to be a
service of its own: a fresh request window for each, and a window record held open in the data dir, so 130
made-up subdomains left 128 more descriptors open on the proxy. Now they share one service (``other-cc``,
kept under ``other.commoncrawl.org``), and the descriptors stay bounded whatever the names.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import requests

from politeproxy.policy.services import SERVICE_HOST
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc
from tests.support.proxyio import upstream_toml
from tests.support.upstream_proc import Certs, Upstream

NAMES = [f"h{i}x.commoncrawl.org" for i in range(130)]
HOST_FDS = 64  # stores/file_records.py MAX_HOST_FDS: host records kept open (LRU), a constant
POOL = 8 + 8  # upstream.max_connections here, plus the pool's headroom (proxy/origin/upstream.py HEADROOM)


def open_fds(p: ProxyProc) -> list[str]:
    """What each of the proxy's descriptors is (a path, or socket:[inode] and the like)."""
    out = []
    for fd in os.listdir(f"/proc/{p.proc.pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{p.proc.pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            pass
    return out


def test_every_unknown_name_under_commoncrawl_org_was_a_service_with_its_own_window(
    proxy_factory: Callable[..., ProxyProc], upstream: Upstream, certs: Certs
) -> None:
    # plain http:// to each name, each resolved by the proxy's table (never DNS) to the fake upstream
    resolve = {f"{n}:80": f"127.0.0.1:{upstream.plain_port}" for n in NAMES}
    schedule = '[schedule]\nbackend = "file"\nglobal_rate = "0"\n'
    p = proxy_factory(
        None, NO_ROBOTS + schedule + upstream_toml(upstream, certs, resolve, max_connections="8")
    )
    proxies = {"http": p.url}

    def get(name: str) -> int:
        return requests.get(f"http://{name}/size/1", proxies=proxies, timeout=30).status_code

    assert get("data.commoncrawl.org") == 200  # the store's files for a named service are open now
    before = len(open_fds(p))
    with ThreadPoolExecutor(4) as ex:
        codes = list(ex.map(get, NAMES))
    assert codes == [200] * len(NAMES)
    assert len({a["host"] for a in upstream.log()} & set(NAMES)) == len(NAMES)  # each went upstream
    # one window record for all of them, beside the named services' own (/status reads those)
    named = set(SERVICE_HOST.values())
    files = set(os.listdir(p.data_dir / "windows"))
    assert "other.commoncrawl.org" in files and files <= named, sorted(files)
    fds = open_fds(p)
    # the records' descriptors (the folder's own, held to open them without following links, is not one)
    windows = [f for f in fds if f.startswith(str(p.data_dir / "windows") + "/")]
    assert len(windows) <= len(named), windows  # a window record per name held 64 open (the fence)
    # Host records stay open up to HOST_FDS (least recently used closed first), idle upstream connections
    # up to the pool's bound, and one window record; 130 names with a window each added 128 before.
    assert len(fds) - before <= HOST_FDS + POOL + len(named), sorted(fds)
