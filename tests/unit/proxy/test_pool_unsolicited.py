"""Upstream bytes nobody asked for never become an answer (issue 25, items 3 and 4), for GET and HEAD alike
(one upstream client since issue 44), over real TLS sockets to a raw upstream that misbehaves on purpose
(tests/support/misbehave.py, a threaded server: it keeps talking while this test's loop is blocked).

The race the proxy meets under load is made certain here: the loop is blocked (a plain ``time.sleep``) while
the unasked answer reaches the kernel, so when the next request takes the idle connection the loop has not
read those bytes yet. A connection with bytes waiting must not be reused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from multidict import CIMultiDict
from yarl import URL

from politeproxy.proxy.origin.h1conn import UpstreamFailed
from politeproxy.proxy.origin.upstream import Upstream
from tests.support.misbehave import Misbehaving, answer_body
from tests.support.upstream_proc import Certs, make_certs

D = "data.commoncrawl.org"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pool-certs"))


@pytest.fixture(scope="module")
def server(certs: Certs) -> Iterator[Misbehaving]:
    s = Misbehaving("tls", certs.server_pem)
    yield s
    s.close()


@pytest.fixture
async def up(server: Misbehaving, certs: Certs) -> AsyncIterator[Upstream]:
    u = Upstream({f"{D}:443": f"127.0.0.1:{server.port}"}, ca_file=str(Path(certs.ca_file)))
    yield u
    await u.close()


async def fetch(up: Upstream, method: str, path: str) -> tuple[int, str, bytes]:
    url = URL(f"https://{D}:443{path}", encoded=True)
    async with up.exchange(method, url, CIMultiDict(), None, "paced", 5) as a:
        body = b""
        while chunk := await a.content.read(1 << 16):
            body += chunk
        return a.status, a.headers.get("Content-Length", ""), body


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("loop_blocked", [False, True])
async def test_an_idle_connection_that_spoke_is_never_reused(
    up: Upstream, server: Misbehaving, method: str, loop_blocked: bool
) -> None:
    junk, nxt = f"/crawl-data/idlejunk-{method}-{loop_blocked}", f"/crawl-data/next-{method}-{loop_blocked}"
    assert (await fetch(up, method, junk))[0] == 200
    if loop_blocked:
        server.wait_junk(junk)  # blocks the loop on purpose: the unasked answer waits in the kernel, unread
        time.sleep(0.05)  # noqa: ASYNC251 - loopback delivers at once; a margin all the same
    else:
        await asyncio.to_thread(server.wait_junk, junk)
        await asyncio.sleep(0.2)  # the loop reads it while the connection is idle
    want = answer_body("tls", method, nxt)
    got = await fetch(up, method, nxt)
    assert got == (200, str(len(want)), want if method == "GET" else b""), got  # never EVIL's
    assert server.connection_of(nxt, method) != server.connection_of(junk, method)


async def test_a_body_longer_than_its_length_fails_the_read(up: Upstream) -> None:
    """Content-Length 10, 21 bytes in one write: the reader meets a failure instead of the first 10 bytes
    (what the relay turns into a cut, and the cache into nothing stored)."""
    with pytest.raises(UpstreamFailed, match="more bytes than its answer's length"):
        await fetch(up, "GET", "/crawl-data/long-unit")


async def test_an_answer_followed_by_another_fails_and_its_connection_goes(
    up: Upstream, server: Misbehaving
) -> None:
    with pytest.raises(UpstreamFailed, match="more bytes than its answer's length"):
        await fetch(up, "GET", "/crawl-data/trailing-unit")
    want = answer_body("tls", "GET", "/crawl-data/after-trailing-unit")
    assert (await fetch(up, "GET", "/crawl-data/after-trailing-unit"))[2] == want
    assert server.connection_of("/crawl-data/after-trailing-unit") != server.connection_of(
        "/crawl-data/trailing-unit"
    )
