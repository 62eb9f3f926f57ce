"""The listener: accepts client connections and owns them; each is read by front.py's protocol (the
project's one server protocol, h1server.py over httptools), whose first head routes the connection.

A routed CONNECT comes back here: intercepted for paced hosts; for the rest, a tunnel that peek.py opens
(blind, unless the client's TLS hello names a paced host). A plain connection stays with the front
protocol, which hands each request here (``plain``: its destination checked, then the forwarder). An
intercepted tunnel upgrades the connection to TLS with a leaf for the CONNECT target and attaches the same
protocol (``H1Server``) to the TLS transport, made with the connection's Tunnel.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from politeproxy.pacing.pacer import Pacer
from politeproxy.policy import routing
from politeproxy.policy import settings as defaults
from politeproxy.policy.access import Access
from politeproxy.policy.classify import Classifier
from politeproxy.policy.routing import Refusal, Target
from politeproxy.proxy.common import fastnet
from politeproxy.proxy.common.clientside import own
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.proxy.common.exchange import Tunnel
from politeproxy.proxy.common.heap import HeapTrim
from politeproxy.proxy.door import intercept, tunnel
from politeproxy.proxy.door.ca import CertificateAuthority
from politeproxy.proxy.door.front import FrontProtocol, refusals
from politeproxy.proxy.door.h1server import H1Server
from politeproxy.proxy.door.pacedaddrs import PacedAddresses
from politeproxy.proxy.door.peek import PeekingTunnel
from politeproxy.proxy.door.served import Served
from politeproxy.proxy.forwarding.forward import Admin, Forwarder
from politeproxy.proxy.forwarding.robots_fetch import RobotsWatcher
from politeproxy.proxy.origin.upstream import Upstream

log = logging.getLogger("politeproxy")


@dataclass
class Timeouts:
    handshake: float = defaults.HANDSHAKE_TIMEOUT
    header: float = defaults.HEADER_TIMEOUT
    idle: float = defaults.IDLE_TIMEOUT
    max_header_size: int = defaults.MAX_HEADER_SIZE
    max_connections: int = defaults.MAX_CLIENT_CONNECTIONS  # client connections open at once (tunnels too)


class Proxy:
    """Everything the I/O layer needs, wired once; ``app.py`` builds it from the config.

    It owns every client connection (``clients``, capped at ``max_connections``), every task it starts
    (``tasks``) and every blind tunnel (``pairs``); ``close()`` ends them all, bounded in time.
    """

    def __init__(
        self,
        *,
        ca: CertificateAuthority,
        classifier: Classifier,
        pacer: Pacer,
        upstream: Upstream,
        events: ProxyEvents,
        access: Access,
        timeouts: Timeouts,
        admin: Admin,
        robots: RobotsWatcher | None = None,
        tunnel_ports: frozenset[int] = frozenset({443}),
        allow_private_destinations: bool = False,
        allow_ip_connect: bool = routing.ALLOW_IP_CONNECT,
    ) -> None:
        self.tunnel_ports = tunnel_ports
        self.allow_ip_connect = allow_ip_connect  # CONNECT to an IP literal (refused unless set)
        self.allow_private_destinations = allow_private_destinations
        self.ca = ca
        self.classifier = classifier
        self.upstream = upstream
        self.events = events
        self.access = access
        self.timeouts = timeouts
        self.server: asyncio.Server | None = None
        self.destinations = tunnel.Destinations(
            allow_private_destinations, upstream.resolver.lookup, upstream.connect_timeout
        )
        self.open_tunnels = 0
        self.clients: set[asyncio.Transport] = set()
        self._sweep_at = 64
        self.tasks: set[asyncio.Task[None]] = set()
        self.pairs: set[tunnel.RelayPair] = set()
        self.heap = HeapTrim()  # freed heap pages back to the system after connection churn (heap.py)
        self._trimming: asyncio.Task[None] | None = None
        t = (upstream.connect_timeout, timeouts.handshake, timeouts.idle)  # the peek: handshake_timeout
        self.peeker = PeekingTunnel(*t, self.hosts_paced, self._tunnel_change, self._bytes_seen, self.pairs)
        self.peeker.on_refused = lambda: events.rejected("other", "destination")
        # With allow_ip_connect: the paced name an IP literal's address belongs to (read per refresh:
        # a reload may swap the classifier).
        self.paced_addresses = PacedAddresses(
            lambda: self.classifier.hosts.concrete_hosts(), upstream.resolver.lookup, upstream.connect_timeout
        )
        self.forwarder = Forwarder(
            classifier=classifier,
            pacer=pacer,
            upstream=upstream,
            events=events,
            access=access,
            robots=robots,
            admin=admin,
        )
        # What every intercepted connection's H1Server is given, bound once: four bound methods made per
        # connection were 256 bytes of each held request (issue 44).
        self._served_by = (self.forwarder.tunneled, self.timeouts, self.report, self.spawn, self._tunnel_lost)
        self._task_done_cb = self._task_done  # one bound method for every task's done callback

    def hosts_paced(self, host: str) -> bool:
        return bool(self.classifier.hosts.matches(host))

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, host: str, port: int, reuse_port: bool = False) -> asyncio.Server:
        """``reuse_port``: one of several workers on one port (SO_REUSEPORT; commands/supervisor.py)."""
        loop = asyncio.get_running_loop()
        if (fast := fastnet.enable(loop)) is not None:  # optional extra [fast]: before any socket exists
            log.info("transports: %s", fast)
        self.server = await loop.create_server(
            lambda: FrontProtocol(self),
            host,
            port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            backlog=2048,
        )
        self.destinations.own_ports = frozenset(int(s.getsockname()[1]) for s in self.server.sockets)
        self._trimming = loop.create_task(self.heap.run())
        return self.server

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def admit(self, transport: asyncio.Transport) -> bool:
        """Count a new client connection in, unless ``max_connections`` are open already."""
        limit = self.timeouts.max_connections
        if len(self.clients) >= min(self._sweep_at, limit):
            # Connections handed to a tunnel leave no callback here: drop the closed ones.
            self.clients = {t for t in self.clients if not t.is_closing()}
            self._sweep_at = max(64, 2 * len(self.clients))
        if len(self.clients) >= limit:
            return False
        self.clients.add(transport)
        self.heap.opened()
        return True

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        """Run a connection task, keeping a reference until it is done (close() awaits it)."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done_cb)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("connection task failed", exc_info=task.exception())

    async def close(self, timeout: float = 2.0) -> None:
        """Stop listening, close every tunnel and connection, and wait (bounded) for their tasks."""
        if self.server:
            self.server.close()
        if self._trimming is not None:
            self._trimming.cancel()
        for pair in list(self.pairs):
            pair.close()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=timeout)
        for t in list(self.clients):
            if not t.is_closing():
                t.abort()
        self.clients.clear()

    def _tunnel_change(self, delta: int) -> None:
        self.open_tunnels += delta
        self.events.tunnels_changed(self.open_tunnels)

    def _tunnel_lost(self, _served: H1Server) -> None:
        self._tunnel_change(-1)

    # -- plain requests: their destinations --------------------------------------------------------

    def report(self, client: str, r: Refusal) -> None:
        """Log and count a refusal of ``client``'s request or connection."""
        refusals.info(client, "%s: %d %s", client, r.status, r.message)
        self.events.rejected("other", r.why)

    async def plain(self, req: Served) -> None:
        """A request on a plain connection to the proxy port: its destination checked, then forwarded (or
        the admin paths, in origin form; or the forwarder's 407)."""
        raw = req.target
        if (
            raw.startswith("/")
            or raw == "*"
            or not self.access.auth_ok(req.headers.get("Proxy-Authorization"))
        ):
            await self.forwarder.plain(req)
            return
        parsed = routing.parse_absolute_target(raw)
        client = req.remote
        r = (
            parsed
            if isinstance(parsed, Refusal)
            else routing.bucket_refusal(parsed[1].host, paced=self.hosts_paced(parsed[1].host))
        )
        if r is None and not isinstance(parsed, Refusal):
            r = await self.destinations.for_request(client, parsed[1]) or await self._by_address(parsed[1])
        if r is None:
            await self.forwarder.plain(req)
            return
        self.report(client, r)
        await req.answer(own(r.status, r.message))

    async def _by_address(self, target: Target) -> Refusal | None:
        """A plain request to an IP literal: refused unless allow_ip_connect, and then still when a paced
        name resolves to it (no SNI here: the URL's address is all there is)."""
        if target.ip is None:
            return None
        if (
            r := routing.ip_refusal(target, allow_ip_connect=self.allow_ip_connect, connect=False)
        ) is not None:
            return r
        owner = await self.paced_addresses.owner(target.ip, target.port)
        return routing.owned_refusal(target, owner) if owner is not None else None

    # -- CONNECT ------------------------------------------------------------------------------------

    async def intercept(
        self, transport: asyncio.Transport, tunnel: Tunnel, leftover: bytes, answered: bool = False
    ) -> None:
        """Intercept the CONNECT ``tunnel``; ``answered``: the peek sent the 200 already."""

        def attach(tls: asyncio.Transport) -> asyncio.Protocol:
            # The tunnel (and its pipeline) goes to the protocol here, and from it to the forwarder by
            # parameter: no table maps a connection to its tunnel.
            served = H1Server(tunnel, *self._served_by)
            self._tunnel_change(+1)
            return served

        await intercept.upgrade(
            transport,
            tunnel.client,
            tunnel.host,
            tunnel.port,
            leftover,
            context_for=self.ca.context,
            handshake_timeout=self.timeouts.handshake,
            attach=attach,
            answered=answered,
        )

    def _bytes_seen(self, from_client: bool, n: int) -> None:
        self.events.bytes_relayed("client_to_upstream" if from_client else "upstream_to_client", n)

    async def tunnel(self, front: FrontProtocol, target: Target, leftover: bytes, who: str) -> None:
        """A tunnel to a checked address of ``target`` (resolved here, once): blind, unless the client's
        TLS hello names a paced host (peek.py), which is then intercepted like a CONNECT to that host."""
        assert front.transport is not None
        try:
            dests = await self.destinations.for_tunnel(front.client, target)
        except (OSError, TimeoutError) as e:
            why = "timed out" if isinstance(e, TimeoutError) else (getattr(e, "strerror", None) or str(e))
            status, reason = (504, "Gateway Timeout") if isinstance(e, TimeoutError) else (502, "Bad Gateway")
            front._fail(status, reason, f"cannot resolve {target.host}: {why}", "upstream")
            return
        if isinstance(dests, Refusal):
            front.refuse(dests)
            return
        if (ip := routing.ip_refusal(target, allow_ip_connect=self.allow_ip_connect)) is not None:
            front.refuse(ip)
            return
        # An IP literal (allow_ip_connect) that a paced name resolves to: only a hello naming a paced
        # host opens it (intercepted, paced); anything else would reach Common Crawl unpaced.
        owner = await self.paced_addresses.owner(target.ip, target.port) if target.ip is not None else None
        blind = None
        if owner is not None:
            blind = f"{target.ip} is an address of {owner}, and the TLS hello names no paced host: closed"
            blind += " (CONNECT to the name)"

        async def by_name(transport: asyncio.Transport, name: str, initial: bytes) -> None:
            tunnel = Tunnel(front.client, name, target.port, who)
            await self.intercept(transport, tunnel, initial, answered=True)

        where = (target.host, target.port)
        await self.peeker.open(front.transport, front.client, where, leftover, dests, by_name, blind)
