"""``Permit``: one request's turn from ``Pacer.permit``, and its own async context.

A small class rather than an @asynccontextmanager (issue 15: the per-request cost of the hot path): entering
waits for the slot or the exempt place, leaving gives an exempt place back, with no generator frames or
async-generator registration per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from politeproxy.policy.backoff import Delay
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import DEFAULT_PIPELINE

if TYPE_CHECKING:
    from politeproxy.pacing.pacer import Pacer


class Permit:
    """One request's turn, from ``Pacer.permit``: how long it was held, and where its answer goes.

    It is its own async context (a small class, not an @asynccontextmanager: no generator frames or
    async-generator registration per request, issue 15): entering waits for the slot or exempt place,
    leaving gives an exempt place back."""

    __slots__ = ("_arrived", "_held", "_pacer", "host", "klass", "pipeline", "waited")

    def __init__(
        self,
        pacer: Pacer,
        host: str,
        klass: Klass,
        waited: float = 0.0,
        pipeline: str = DEFAULT_PIPELINE,
        arrived: float | None = None,
    ) -> None:
        self._pacer = pacer
        self.host = host
        self.klass = klass
        self.waited = waited
        self.pipeline = pipeline  # the name it counted as (bounded: configured, first 50 seen, "other")
        self._arrived = arrived
        self._held = False  # an exempt place to give back on leaving

    async def __aenter__(self) -> Permit:
        pacer = self._pacer
        if self.klass is Klass.EXEMPT:
            self.waited = await pacer.exempt_enter(self.host, self._arrived, self.pipeline)
            self._held = True
        else:
            self.waited = await pacer.wait_paced(self.host, self._arrived, self.pipeline)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            self._pacer.places.release(self.host, self.pipeline)

    async def answered(self, status: int | None, retry_after: str | None) -> Delay | None:
        """Feed the upstream's answer back (``status`` None: the connection failed or timed out).

        The store write runs in a task the pacer owns and is awaited through ``asyncio.shield``: a caller
        cancelled here (its client left) never loses a throttle the upstream already sent.
        """
        return await self._pacer.feedback(self.host, status, retry_after)
