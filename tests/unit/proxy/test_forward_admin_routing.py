"""Which handler answers a request on a plain proxy connection or inside a tunnel (no sockets): origin
form and ``*`` go to the injected admin handler, absolute form is forwarded (or refused 407), and inside
a tunnel nothing reaches the admin handler. Then the admin answers themselves
(politeproxy/observe/admin.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from politeproxy.observe.admin import Admin
from politeproxy.observe.metrics import Metrics
from politeproxy.policy.access import Access
from politeproxy.policy.classify import Classifier
from politeproxy.policy.hosts import HostSet
from politeproxy.proxy.common.clientside import own
from politeproxy.proxy.common.events import NoProxyEvents
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.forwarding.forward import Forwarder
from tests.support.fake_client import RecordedSide


def _request(method: str, target: str, headers: dict[str, str] | None = None, peer: str = "127.0.0.1") -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda k, d=None: (peer, 40000) if k == "peername" else d
    return make_mocked_request(method, target, headers=headers or {}, transport=transport)


class Recorder:
    def __init__(self) -> None:
        self.admin: list[str] = []
        self.forwarded: list[tuple[str, str, int, str]] = []


def _forwarder(rec: Recorder, users: dict[str, str]) -> Forwarder:
    async def admin(side: Any) -> None:
        rec.admin.append(side.target)
        await side.answer(own(200, "admin"))

    f = Forwarder(
        classifier=Classifier(HostSet(["data.commoncrawl.org"])),
        pacer=mock.Mock(),  # never reached: _forward is replaced below
        upstream=mock.Mock(),
        events=NoProxyEvents(),
        access=Access([], users),
        robots=None,
        admin=admin,
    )

    async def forward(client: Any, scheme: str, host: str, port: int, path: str, who: str) -> None:
        rec.forwarded.append((scheme, host, port, path))

    f._forward = forward  # type: ignore[method-assign]
    return f


CASES = [
    # (target, tunnel, headers, users, expected: "admin" | "forwarded" | status)
    ("/metrics", None, {}, {}, "admin"),
    ("/healthz?x=1", None, {}, {"u": "p"}, "admin"),  # admin paths take no password, as before
    ("*", None, {}, {}, "admin"),
    ("http://data.commoncrawl.org/x", None, {}, {}, "forwarded"),
    ("http://data.commoncrawl.org/x", None, {}, {"u": "p"}, 407),
    ("ftp://data.commoncrawl.org/x", None, {}, {}, 400),
    ("/metrics", ("data.commoncrawl.org", 443), {"Host": "data.commoncrawl.org"}, {}, "forwarded"),
    ("/metrics", ("data.commoncrawl.org", 443), {"Host": "other.example"}, {}, 421),
]


@pytest.mark.parametrize(("target", "tunnel", "headers", "users", "expected"), CASES)
def test_admin_or_proxy(
    target: str, tunnel: tuple[str, int] | None, headers: dict[str, str], users: dict[str, str], expected: Any
) -> None:
    rec = Recorder()
    f = _forwarder(rec, users)
    if tunnel is None:  # a plain connection: the proxy port's protocol hands the request to plain()
        side = RecordedSide("GET", target, headers, remote="127.0.0.1")
        asyncio.run(f.plain(side))
        status = side.status
    else:  # inside a tunnel: the protocol hands the request and its Tunnel to tunneled()
        side = RecordedSide("GET", target, headers, remote="127.0.0.1")
        asyncio.run(f.tunneled(side, Tunnel("127.0.0.1", *tunnel, "127.0.0.1")))
        status = side.status
    if expected == "admin":
        assert rec.admin == [target] and not rec.forwarded
    elif expected == "forwarded":
        assert rec.forwarded and not rec.admin
    else:
        assert status == expected and not rec.admin and not rec.forwarded


def _admin() -> Admin:
    return Admin(Metrics(), lambda: {"store": "memory", "degraded": False, "queued": 0}, lambda: b"PEM")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/metrics", 200),
        ("HEAD", "/metrics", 200),
        ("GET", "/healthz", 200),
        ("GET", "/ca.pem", 200),
        ("GET", "/", 404),
        ("GET", "/metrics/x", 404),
        ("POST", "/metrics", 405),
        ("DELETE", "/ca.pem", 405),
    ],
)
def test_admin_answers(method: str, path: str, status: int) -> None:
    resp: Any = asyncio.run(_admin().handle(_request(method, path)))
    assert resp.status == status
    if path == "/ca.pem" and status == 200:
        assert resp.body == b"PEM" and resp.content_type == "application/x-pem-file"
    if path == "/healthz":
        assert json.loads(resp.body) == {"status": "ok", "store": "memory", "degraded": False, "queued": 0}
    if path == "/metrics" and status == 200:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b"politeproxy_tunnels_open" in resp.body


@pytest.mark.parametrize(
    ("peer", "allow", "status"),
    [
        ("127.0.0.1", [], 200),
        ("::1", [], 200),
        ("192.0.2.5", [], 403),
        ("192.0.2.5", ["192.0.2.0/24"], 200),
        ("198.51.100.1", ["192.0.2.0/24"], 403),
    ],
)
def test_metrics_listen_guard(peer: str, allow: list[str], status: int) -> None:
    """--metrics-listen: loopback and allow_clients only; [auth] users open nothing there."""
    resp = asyncio.run(_admin().guarded(_request("GET", "/healthz", peer=peer), Access(allow, {})))
    assert resp.status == status
