"""The typed records the proxy layer carries: an ``Exchange`` (one request and its answer) and a ``Tunnel``
(one intercepted client connection). The forwarder, relay() and the cache front fill an Exchange as the
request goes; the access line (observe/logs.py) renders it once it is done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from politeproxy.policy.answers import Quota
from politeproxy.policy.classify import Klass


class Copy(Protocol):
    """A copy taken of an answer as it streams to the client (cachetee.Tee): relay() feeds it."""

    def would_store(self, method: str, status: int, headers: Mapping[str, str]) -> bool: ...
    async def start(self, method: str, status: int, headers: Mapping[str, str]) -> None: ...
    async def write(self, chunk: bytes) -> None: ...

    # An index question's turn (issue 43), awaited before asking upstream; True: answered without asking
    gate: Callable[[], Awaitable[bool]] | None


@dataclass(slots=True)
class Tunnel:
    """One intercepted CONNECT: who opened it and where it may go. ``who`` is the pipeline it asked for,
    read once from the CONNECT (its proxy user name, else the client's address)."""

    client: str
    host: str
    port: int
    who: str


@dataclass(slots=True)
class Exchange:
    """One request and its answer, filled in as it goes; also the access line's record (logs.py).

    All but the last three fields are on the access line. Not frozen: a frozen dataclass sets each field
    through ``object.__setattr__`` (per request, issue 15)."""

    client: str
    method: str
    host: str
    path: str  # the request target, already through ``events.access_path``
    klass: Klass
    pipeline: str  # who asked: the name it counts as (bounded by ``Pacer.pipeline``)
    wait: float = 0.0  # seconds held by the pacer (or until its refusal)
    status: int = 0  # the answer's status; 0 while none was given
    bytes: int = 0  # body bytes sent to the client
    duration: float = 0.0  # seconds from arrival to the end of the answer
    retries: int = 0  # tries the proxy repeated after a throttle
    note: str | None = None  # why it ended otherwise: "client_gone", "upstream_broke", "max_wait", ...
    cache: str | None = None  # "hit", "miss", "stale" or "bypass" for a cacheable host (issue 14)
    retry_after: float | None = None  # the pacer's delay after the last answer, seconds
    tee: Copy | None = None  # a cache miss's copy to disk, fed by relay() (proxy/forwarding/cached.py)
    quota: Quota | None = None  # its service's quota for the RateLimit fields (issue 41), when known

    @property
    def held(self) -> bool:
        """It went through the pacer: its own answers name the wait and the pipeline."""
        return self.klass is not Klass.PASSTHROUGH

    @property
    def label(self) -> str:
        """The host as a metric label: a passthrough request's host is not bounded, so "other"."""
        return self.host if self.klass is not Klass.PASSTHROUGH else "other"
