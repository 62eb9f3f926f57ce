"""One request's Exchange, typed from the front door to the metric label and the access line: the pipeline a
CONNECT asked for is read once (front.py) and carried on its Tunnel; the forwarder bounds it once per request
and hands the same name to the pacer, the answer's header, ``events.answered`` and the access record."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Coroutine
from typing import Any
from unittest import mock

from politeproxy.pacing.base import PacingSettings, WaitTooLong
from politeproxy.policy.access import Access
from politeproxy.policy.classify import Classifier, Klass
from politeproxy.policy.hosts import HostSet
from politeproxy.policy.routing import Target
from politeproxy.proxy.common.events import NoProxyEvents
from politeproxy.proxy.common.exchange import Exchange, Tunnel
from politeproxy.proxy.common.passage import PIPELINE_HEADER, WAIT_HEADER
from politeproxy.proxy.door.front import FrontProtocol
from politeproxy.proxy.forwarding.forward import Forwarder
from tests.support.fake_client import RecordedSide

D = "data.commoncrawl.org"


def basic(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()


class Sink(NoProxyEvents):
    def __init__(self) -> None:
        self.answers: list[tuple[str, str, int | None, str]] = []
        self.records: list[Exchange] = []

    def answered(self, host: str, klass: str, status: int | None, pipeline: str = "default") -> None:
        self.answers.append((host, klass, status, pipeline))

    def access(self, record: Exchange) -> None:
        self.records.append(record)


class Refusing:
    """A pacer that bounds names visibly and refuses every paced request (max_wait)."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []
        self.permits: list[str] = []
        self.settings = PacingSettings()
        self.quotas = mock.Mock(cached=mock.Mock(return_value=None), quota=mock.AsyncMock(return_value=None))

    def pipeline_of(self, name: str | None) -> str:
        self.asked.append(name)
        return f"b-{name}"

    def permit(
        self,
        host: str,
        klass: Klass,
        arrived: float | None,
        pipeline: str,
        bound: float | None = None,
        again: bool = False,
    ) -> Any:
        self.permits.append(pipeline)
        refusal = WaitTooLong(7.0, "would wait 7.0s", "max_wait")
        return mock.Mock(__aenter__=mock.AsyncMock(side_effect=refusal), __aexit__=mock.AsyncMock())


def forwarder(pacer: Refusing, sink: Sink) -> Forwarder:
    return Forwarder(
        classifier=Classifier(HostSet([D])),
        pacer=pacer,  # type: ignore[arg-type]
        upstream=mock.Mock(),
        events=sink,
        access=Access([], {}),
        robots=None,
        admin=mock.AsyncMock(),
    )


def test_the_tunnels_pipeline_reaches_the_permit_the_header_the_metric_and_the_access_line() -> None:
    pacer, sink = Refusing(), Sink()
    f = forwarder(pacer, sink)
    side = RecordedSide("GET", "/crawl-data/a.gz?sig=s3cr3t", {"Host": D})
    asyncio.run(f.tunneled(side, Tunnel("10.0.0.9", D, 443, "etl")))  # the tunnel, by parameter
    assert pacer.asked == ["etl"] and pacer.permits == ["b-etl"]  # bounded once, then carried
    assert side.status == 503 and side.answer_headers[PIPELINE_HEADER] == "b-etl"
    assert float(side.answer_headers[WAIT_HEADER]) >= 0.0
    assert sink.answers == [(D, "paced", 503, "b-etl")]
    [ex] = sink.records
    assert (ex.client, ex.host, ex.path, ex.klass, ex.pipeline) == (
        "10.0.0.9",
        D,
        "/crawl-data/a.gz?...",
        Klass.PACED,
        "b-etl",
    )
    assert (ex.status, ex.note, ex.retries, ex.cache, ex.tee) == (503, "max_wait", 0, None, None)


def test_a_plain_request_names_its_pipeline_by_its_proxy_user() -> None:
    pacer, sink = Refusing(), Sink()
    f = forwarder(pacer, sink)
    side = RecordedSide("GET", f"http://{D}/x", {"Proxy-Authorization": basic("crawler")})
    asyncio.run(f.plain(side))  # what the proxy port's protocol hands the forwarder
    assert pacer.asked == ["crawler"] and sink.answers[0][3] == "b-crawler"


def test_a_passthrough_exchange_is_not_held_and_counts_as_other() -> None:
    ex = Exchange("c", "GET", "example.org", "/", Klass.PASSTHROUGH, "default")
    assert not ex.held and ex.label == "other"
    paced = Exchange("c", "GET", D, "/", Klass.PACED, "default")
    assert paced.held and paced.label == D


class Door:
    """What FrontProtocol needs of the listener (front.Listener), recording where a CONNECT goes."""

    def __init__(self) -> None:
        self.timeouts = mock.Mock(header=5.0, idle=60.0, max_header_size=8192, max_connections=10)
        self.access = Access(["0.0.0.0/0"], {})  # every client address may connect
        self.events = NoProxyEvents()
        self.tunnel_ports = frozenset({443})
        self.clients: set[asyncio.BaseTransport] = set()
        self.plain = mock.AsyncMock()
        self.report = mock.Mock()
        self.tasks: list[asyncio.Task[None]] = []
        self.intercepted: list[Tunnel] = []
        self.tunneled: list[tuple[Target, str]] = []

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        return True

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    def hosts_paced(self, host: str) -> bool:
        return host == D

    async def intercept(
        self, transport: asyncio.Transport, tunnel: Tunnel, leftover: bytes, answered: bool = False
    ) -> None:
        self.intercepted.append(tunnel)

    async def tunnel(self, front: FrontProtocol, target: Target, leftover: bytes, who: str) -> None:
        self.tunneled.append((target, who))


async def connect(door: Door, head: bytes) -> None:
    front = FrontProtocol(door)
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda k, d=None: ("10.1.2.3", 5000) if k == "peername" else d
    transport.is_closing.return_value = False
    front.connection_made(transport)
    front.data_received(head)
    await asyncio.gather(*door.tasks)


async def test_a_connect_to_a_paced_host_is_intercepted_with_its_pipeline_read_once() -> None:
    door = Door()
    head = f"CONNECT {D}:443 HTTP/1.1\r\nHost: {D}:443\r\nProxy-Authorization: {basic('etl')}\r\n\r\n"
    await connect(door, head.encode())
    assert door.intercepted == [Tunnel("10.1.2.3", D, 443, "etl")] and not door.tunneled


async def test_a_connect_without_a_user_counts_as_its_client_address() -> None:
    door = Door()
    await connect(door, b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n")
    assert not door.intercepted
    [(target, who)] = door.tunneled
    assert (target.host, target.port, who) == ("example.org", 443, "10.1.2.3")
