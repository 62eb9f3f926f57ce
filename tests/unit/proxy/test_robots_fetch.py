"""robots.txt (issue 9 item 18): read to its end within the cap, and a failed fetch never lowers the known
Crawl-delay. The watcher runs in-process against a local TLS server on 127.0.0.1 (real sockets, verified
TLS through the proxy's own upstream client), whose answers per host are set by each test."""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.pacing.pacer import Pacer, PacingSettings
from politeproxy.policy.robots import crawl_delay, effective_crawl_delay
from politeproxy.proxy.forwarding import robots_fetch
from politeproxy.proxy.forwarding.robots_fetch import RobotsWatcher
from politeproxy.proxy.origin.upstream import Upstream
from politeproxy.stores.memory import MemoryStore
from tests.support.upstream_proc import Certs

HOST = "data.commoncrawl.org"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    """A TLS server answering /robots.txt with whatever ``handler`` does."""

    def __init__(self) -> None:
        self.handler: Handler = self.not_found
        self.hits = 0

    @staticmethod
    async def not_found(_r: web.Request) -> web.StreamResponse:
        return web.Response(status=404)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        return await self.handler(request)


@pytest.fixture
async def served(certs: Certs) -> AsyncIterator[tuple[Server, int]]:
    srv = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", srv.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_pem)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield srv, port
    await runner.cleanup()


@pytest.fixture
async def watcher(served: tuple[Server, int], certs: Certs) -> AsyncIterator[RobotsWatcher]:
    _srv, port = served
    # Made-up names reach the same server, whose certificate does not cover them: they fail fast.
    names = {f"n{i}.commoncrawl.org:443": f"127.0.0.1:{port}" for i in range(500)}
    up = Upstream({f"{HOST}:443": f"127.0.0.1:{port}", **names}, str(certs.ca_file), 2.0, 0.5)
    store = MemoryStore(rand=lambda: 0.0)
    pacer = Pacer(store, PacingSettings(gap=0.001, host_intervals=()))
    w = RobotsWatcher(pacer, up, ttl=3600.0, cap=60.0)
    yield w
    for t in list(w.tasks.values()):
        t.cancel()
    await pacer.close()
    await up.close()


async def refresh(w: RobotsWatcher, host: str = HOST) -> float:
    w.ensure(host)
    tasks = list(w.tasks.values())
    assert tasks, "no fetch started"
    await asyncio.wait(tasks, timeout=10)
    return (await w.pacer.host_view(host)).crawl_delay


async def test_a_body_that_arrives_in_pieces_is_read_to_its_end(
    served: tuple[Server, int], watcher: RobotsWatcher
) -> None:
    srv, _ = served
    pad = b"# " + b"x" * 1000 + b"\n"

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"User-agent: *\n" + pad * 50)
        for _ in range(3):
            await asyncio.sleep(0.05)  # the client has read what was buffered by now
            await resp.write(pad * 50)
        await resp.write(b"Crawl-delay: 7\n")
        await resp.write_eof()
        return resp

    srv.handler = slow
    assert await refresh(watcher) == 7.0


async def test_a_file_beyond_the_cap_is_parsed_as_far_as_the_cap(
    served: tuple[Server, int], watcher: RobotsWatcher
) -> None:
    srv, _ = served
    head = b"User-agent: *\nCrawl-delay: 3\n"
    body = (
        head
        + b"#" * (robots_fetch.MAX_ROBOTS_BYTES + 100_000)
        + b"\nUser-agent: politeproxy\nCrawl-delay: 9\n"
    )

    async def big(_r: web.Request) -> web.StreamResponse:
        return web.Response(body=body)

    srv.handler = big
    assert await refresh(watcher) == 3.0  # the group past the cap is never read


async def test_no_robots_txt_means_no_crawl_delay(served: tuple[Server, int], watcher: RobotsWatcher) -> None:
    await watcher.pacer.set_crawl_delay(HOST, 5.0, 0.0)  # known, now stale
    assert await refresh(watcher) == 0.0  # 404: the file is gone, and with it its Crawl-delay


async def _status_503(_r: web.Request) -> web.StreamResponse:
    return web.Response(status=503, text="busy")


async def _hang(_r: web.Request) -> web.StreamResponse:
    await asyncio.sleep(1.5)  # three times the client's 0.5 s read timeout (teardown waits it out)
    return web.Response(text="late")


async def _reset(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()
    await asyncio.sleep(1)
    return web.Response(text="never")


async def _cut_body(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Length": "5000"})
    await resp.prepare(request)
    await resp.write(b"User-agent: *\n")
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.abort()
    return resp


@pytest.mark.parametrize(
    "handler", [_status_503, _hang, _reset, _cut_body], ids=["503", "timeout", "reset", "cut body"]
)
async def test_a_failed_fetch_keeps_the_known_crawl_delay(
    served: tuple[Server, int], watcher: RobotsWatcher, handler: Handler
) -> None:
    srv, _ = served
    await watcher.pacer.set_crawl_delay(HOST, 5.0, 0.0)  # known from an earlier fetch, now stale
    srv.handler = handler
    assert await refresh(watcher) == 5.0
    assert srv.hits >= 1  # (aiohttp itself may retry once on a reset)
    # Tried again later, not on every request.
    watcher.ensure(HOST)
    assert not watcher.tasks
    assert watcher.checked_until[HOST] > asyncio.get_running_loop().time() + 200


async def test_fetches_and_remembered_hosts_are_bounded(
    watcher: RobotsWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(robots_fetch, "MAX_HOSTS", 100, raising=False)
    peak = 0
    for i in range(500):
        watcher.ensure(f"n{i}.commoncrawl.org")
        peak = max(peak, len(watcher.tasks))
        if i % 10 == 9:
            await asyncio.sleep(0.02)
    while watcher.tasks:
        await asyncio.wait(list(watcher.tasks.values()), timeout=10)
    assert peak <= 4
    assert len(watcher.checked_until) <= 100


# -- the parser of the fetched text ---------------------------------------------------------------------

robots_lines = st.lists(
    st.one_of(
        st.sampled_from(["User-agent: *", "User-agent: politeproxy", "User-agent:", "Disallow: /", "#c", ""]),
        st.builds(
            lambda v: f"Crawl-delay: {v}",
            st.one_of(
                st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "--5", "²", "0x10", " 2 ", ""]),
                st.floats(allow_nan=True, allow_infinity=True).map(repr),
                st.text(max_size=12),
            ),
        ),
        st.text(max_size=40),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(lines=robots_lines, sep=st.sampled_from(["\n", "\r\n", "\r"]))
def test_crawl_delay_never_raises_and_is_finite(lines: list[str], sep: str) -> None:
    """Any robots.txt text gives None or a finite, non-negative delay, and the applied delay is finite and
    within [0, cap]; nothing raises."""
    found = crawl_delay(sep.join(lines))
    assert found is None or (math.isfinite(found) and found >= 0)
    applied = effective_crawl_delay(found, 60.0)
    assert math.isfinite(applied) and 0.0 <= applied <= 60.0


def test_crawl_delay_ignores_values_that_are_not_durations() -> None:
    for value in ("nan", "inf", "1e400", "-1"):
        assert crawl_delay(f"User-agent: *\nCrawl-delay: {value}\n") is None, value
