"""Upstream bytes nobody asked for (issue 25, items 3 and 4): a body longer than its Content-Length is cut
and never stored; bytes after a complete answer, or on an idle pooled connection, close that connection
and never become the next request's answer (nor the cache's entry for it).

One raw TLS upstream for data.commoncrawl.org (tests/support/misbehave.py); curl and requests as clients.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
import requests

from tests.support.cache_upstream import CACHE_TOML
from tests.support.misbehave import Behind, answer_body, behind_proxy
from tests.support.processes import need_tool
from tests.support.proxy_proc import ProxyProc
from tests.support.upstream_proc import Certs

D = "data.commoncrawl.org"
BASE = "/crawl-data/CC-MAIN-2024-10/"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Behind]:
    with behind_proxy(tmp_path_factory.mktemp("cache-desync"), certs, CACHE_TOML) as e:
        yield e


def curl(p: ProxyProc, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [need_tool("curl"), "-sS", "--max-time", "30", *args, f"https://{D}{path}"],
        env=p.env,
        capture_output=True,
        text=True,
    )


def get(p: ProxyProc, path: str, method: str = "GET") -> requests.Response:
    verify = p.env["REQUESTS_CA_BUNDLE"]
    return requests.request(method, f"https://{D}{path}", proxies={"https": p.url}, verify=verify, timeout=30)


def test_a_body_longer_than_its_length_is_cut_and_never_stored(env: Behind) -> None:
    path = "/crawl-data/long.warc.gz"
    for i in (1, 2):
        r = curl(env.p, path)
        assert r.returncode != 0 and r.stdout != "0123456789", (
            r.returncode,
            r.stdout,
        )  # a cut, not an answer
        assert env.up.count(path) == i  # nothing stored: the second went upstream again
    with pytest.raises(requests.exceptions.RequestException):
        _ = get(env.p, path).content
    assert env.up.count(path) == 3


def test_an_answer_after_a_complete_answer_is_never_the_next_ones(env: Behind) -> None:
    """An answer followed in the same read by one nobody asked for has more bytes than it announced: it is
    cut like a long body (the proxy cannot tell the two apart), nothing is stored, and the connection goes."""
    first, nxt = "/crawl-data/trailing.warc.gz", BASE + "after-trailing.warc.gz"
    for i in (1, 2):
        r = curl(env.p, first)
        assert r.returncode != 0 and "EVIL" not in r.stdout, (r.returncode, r.stdout)
        assert env.up.count(first) == i
    for _ in range(2):  # the second is a hit of the first's true answer
        assert curl(env.p, nxt).stdout == answer_body("tls", "GET", nxt).decode()
    assert env.up.count(nxt) == 1
    assert env.up.connection_of(nxt) != env.up.connection_of(first)  # not reused after the extra answer


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_bytes_on_an_idle_pooled_connection_are_never_an_answer(env: Behind, method: str) -> None:
    """GET goes through the lean client, HEAD through aiohttp: both pools drop such a connection."""
    junk, nxt = f"/crawl-data/idlejunk-{method}.warc.gz", BASE + f"after-idle-{method}.warc.gz"
    r = get(env.p, junk, method)
    assert r.status_code == 200 and r.headers["ETag"] == '"e1"'
    env.up.wait_junk(junk)  # sent 0.3 s after the answer, on the idle connection
    time.sleep(0.2)  # the proxy's loop reads it meanwhile
    for _ in range(2):
        r = get(env.p, nxt, method)
        want = answer_body("tls", method, nxt)
        assert (r.status_code, r.headers["ETag"], r.headers["Content-Length"]) == (
            200,
            '"e1"',
            str(len(want)),
        )
        assert r.content == (want if method == "GET" else b"")
    assert env.up.count(nxt, method) == 1  # the true answer was stored, and the second was its hit
    assert env.up.connection_of(nxt, method) != env.up.connection_of(junk, method)
