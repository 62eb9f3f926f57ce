"""The admin endpoints, /metrics, /healthz, /ca.pem, /status (JSON) and / (the status page), answered in one
place for the proxy port and for ``--metrics-listen``.

Who may read them: loopback and ``allow_clients`` by address, on the proxy port and on
``--metrics-listen`` alike. On the proxy port a client let in only because ``[auth] users`` are set must
send a valid ``Proxy-Authorization`` (407 otherwise); ``--metrics-listen`` takes no password (403).
Only GET and HEAD are answered.

Which Host they answer (a DNS-rebinding guard: a page in the operator's browser whose name is made to
resolve to this machine sends its own name as Host): an IP literal, ``localhost`` and ``*.localhost``, this
machine's name, the listen address, and the names in ``admin_hosts`` (by default the deploy files' service
names: ``politeproxy``, which deploy/prometheus.yml scrapes, and the Kubernetes Service's). Any other Host
gets a 421 naming the key. A request without Host (HTTP/1.0) comes from no browser and is answered.
``/ca.pem`` answers any Host: the CA certificate is public, and pipelines fetch it by whatever name they
reach the proxy by.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from politeproxy.observe import statuspage
from politeproxy.observe.metrics import Metrics
from politeproxy.observe.workers import WorkerSet, merged_metrics, merged_status
from politeproxy.policy.access import Access
from politeproxy.policy.answers import error_type, proxy_status
from politeproxy.policy.hosts import normalize_host
from politeproxy.policy.routing import Target, split_host_port
from politeproxy.policy.settings import DEFAULTS
from politeproxy.proxy.common.clientside import ClientSide
from politeproxy.proxy.common.passage import add_via

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
PATHS = ("/", "/status", "/metrics", "/healthz", "/ca.pem")
log = logging.getLogger("politeproxy.admin")

StatusSource = Callable[[], Awaitable[dict[str, Any]]]


class AdminRequest(Protocol):
    """What the admin paths read of a request: aiohttp's (``--metrics-listen``) or the proxy port's
    (``Asked``: a request read by the proxy's own protocol, proxy/door/front.py)."""

    @property
    def method(self) -> str: ...
    @property
    def rel_url(self) -> URL: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def remote(self) -> str | None: ...


class Asked:
    """An admin request on the proxy port, as the admin paths read it."""

    __slots__ = ("method", "rel_url", "headers", "remote")

    def __init__(self, side: ClientSide) -> None:
        self.method, self.headers, self.remote = side.method, side.headers, side.remote
        try:
            self.rel_url = URL(side.target, encoded=True)
        except ValueError:
            self.rel_url = URL()


async def write_answer(side: ClientSide, resp: web.Response) -> None:
    """Send an admin answer (an aiohttp Response, built, never served by aiohttp) on the proxy port."""
    body = resp.body if isinstance(resp.body, bytes) else b""
    headers = CIMultiDict(resp.headers)
    headers["Content-Length"] = str(len(body))
    side.start(resp.status, resp.reason, headers)
    await side.write(body)  # nothing of it to a HEAD (served.Served.start)
    await side.end()


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """One of the proxy's own error answers on an admin path: its text, Via and Proxy-Status."""
    resp = web.Response(status=status, text=f"politeproxy: {message}\n", headers=headers)
    add_via(resp.headers)
    if "Proxy-Status" not in resp.headers:
        resp.headers["Proxy-Status"] = proxy_status(error_type(status), message)
    return resp


# The default of admin_hosts (policy/table.py): the deploy files' service names (docker-compose's service,
# which deploy/prometheus.yml scrapes as politeproxy:3128; deploy/k8s.yaml's Service in its namespace).
ADMIN_HOSTS: tuple[str, ...] = DEFAULTS.general.admin_hosts
ANY_HOST = frozenset({"/ca.pem"})  # public data: answered whatever the Host


class HostCheck:
    """Which Host values the admin paths answer (see the module's docstring). Names are compared
    normalised (lower case, no trailing dot); ports are not compared (rebinding keeps the port)."""

    def __init__(self, names: Iterable[str] = ADMIN_HOSTS, listen: str = "") -> None:
        own = {"localhost", socket.gethostname(), listen}
        self.names = frozenset(n for n in (normalize_host(x) for x in (*own, *names)) if n)

    def allows(self, header: str | None) -> bool:
        if header is None:
            return True
        target = split_host_port(header.strip(), default_port=80)
        if not isinstance(target, Target):
            return False
        name = target.host
        return target.ip is not None or name in self.names or name.endswith(".localhost")

    def refusal(self, header: str) -> web.Response:
        shown = repr(header[:100])
        return error_response(
            421,
            f"Host {shown} is not a name of this proxy: the admin paths answer an IP address, localhost, "
            "this machine's name, the listen address or a name in admin_hosts (a DNS-rebinding guard)",
        )


class Admin:
    """``handle`` answers an admin request; the proxy layer gets it injected as a callable (its
    listener has checked the client already). ``guarded`` is the handler of ``--metrics-listen``."""

    def __init__(
        self,
        metrics: Metrics,
        health: Callable[[], dict[str, Any]],
        ca_pem: Callable[[], bytes],
        status: StatusSource | None = None,
        hosts: Iterable[str] = ADMIN_HOSTS,
        listen: str = "",
    ) -> None:
        self.host_check = HostCheck(hosts, listen)  # admin_hosts and the listen address (app.py)
        self.metrics = metrics
        self.health = health
        self.ca_pem = ca_pem
        self.status = status  # the /status document (politeproxy.status.StatusBoard.document)
        self.workers: WorkerSet | None = None  # set by app.py in a worker of --workers N: answers merge

    def on_proxy_port(self, access: Access) -> Callable[[ClientSide], Awaitable[None]]:
        """The handler for admin requests on the proxy port (forward.Admin)."""

        async def handler(side: ClientSide) -> None:
            if not access.admin_allowed(side.remote, side.headers.get("Proxy-Authorization")):
                challenge = {"Proxy-Authenticate": 'Basic realm="politeproxy"'}
                await write_answer(side, error_response(407, "proxy authentication required", challenge))
                return
            await write_answer(side, await self.handle(Asked(side)))

        return handler

    async def guarded(self, request: AdminRequest, allowed: Access) -> web.Response:
        if not allowed.ip_allowed(request.remote or ""):
            return error_response(403, "client not allowed")
        return await self.handle(request)

    async def handle(self, request: AdminRequest) -> web.Response:
        path = request.rel_url.path
        host = request.headers.get("Host")
        if path not in ANY_HOST and not self.host_check.allows(host):
            assert host is not None
            return self.host_check.refusal(host)
        if request.method not in ("GET", "HEAD"):
            return error_response(405, "admin endpoints answer GET only")
        if path == "/metrics":
            return web.Response(body=await self._metrics(), headers={"Content-Type": PROMETHEUS_TEXT})
        if path == "/healthz":
            return web.json_response({"status": "ok", **self.health()})
        if path == "/ca.pem":
            return web.Response(body=self.ca_pem(), content_type="application/x-pem-file")
        if path == "/status" and self.status is not None:
            return await self._status()
        if path == "/" and self.status is not None:
            return web.Response(body=statuspage.PAGE, headers=statuspage.HEADERS)
        return error_response(404, f"not found: the admin endpoints are {', '.join(PATHS)}")

    async def _metrics(self) -> bytes:
        """This process's metrics; with workers, every worker's, labelled (observe/workermerge.py)."""
        own = self.metrics.render()
        return own if self.workers is None else await merged_metrics(self.workers, own)

    async def _status(self) -> web.Response:
        assert self.status is not None
        try:
            doc = await self.status()
            if self.workers is not None:  # the whole proxy, and each worker (observe/workermerge.py)
                doc = await merged_status(self.workers, doc)
            body = json.dumps(doc, allow_nan=False, separators=(",", ":"))
        except Exception:  # noqa: BLE001 - a bug in the view must not take the admin port down
            log.exception("building the status document failed")
            return error_response(500, "the status document could not be built (see the proxy's log)")
        return web.Response(text=body, content_type="application/json", headers={"Cache-Control": "no-store"})


async def serve(
    admin: Admin, host: str, port: int, allow_clients: list[str], reuse_port: bool = False
) -> web.BaseRunner:
    """``--metrics-listen``: the same answers on their own address, to loopback and ``allow_clients``
    (addresses only: a proxy password opens nothing here). The caller cleans the runner up."""
    allowed = Access(allow_clients, {})

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        return await admin.guarded(request, allowed)

    runner = web.ServerRunner(web.Server(handler), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_port=reuse_port or None).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
