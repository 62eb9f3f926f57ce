"""``Permit``: one request's turn from ``Pacer.permit``, and its own async context.

A small class rather than an @asynccontextmanager (issue 15: the per-request cost of the hot path): entering
waits for the slot or the exempt place, leaving gives an exempt place back, with no generator frames or
async-generator registration per request.

The permit knows the pacer only through ``Turns``, what it asks of it; pacer.py imports this module, never
the other way round. Behind it: the note a refusal carries (why the host rests) and the retry decision
(``policy.retry``'s rules on the pacer's settings and clock), so the proxy asks the permit, not the rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from politeproxy.pacing.base import PacingSettings, WaitTooLong
from politeproxy.policy.backoff import Delay
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import DEFAULT_PIPELINE
from politeproxy.policy.retry import RetryDecision, decide_retry
from politeproxy.policy.signals import Signal


class Turns(Protocol):
    """What a permit asks of the pacer that made it (``Pacer`` implements it; the underscored names are
    private to the pacing package: nothing else calls them)."""

    monotonic: Callable[[], float]

    @property
    def settings(self) -> PacingSettings: ...
    async def _wait_paced(
        self, host: str, arrived: float | None, pipeline: str, bound: float | None = None, again: bool = False
    ) -> float: ...
    async def _exempt_enter(
        self, host: str, arrived: float | None, pipeline: str, bound: float | None = None
    ) -> float: ...
    def _exempt_leave(self, host: str, pipeline: str) -> None: ...
    def _probing(self, host: str) -> bool: ...
    async def _feedback(
        self, host: str, status: int | None, retry_after: str | None, signal: Signal | None
    ) -> Delay | None: ...
    async def _rest_note(self, host: str, wait: float) -> str: ...


class Permit:
    """One request's turn, from ``Pacer.permit``: how long it was held, whether it is the probe, and where
    its answer goes.

    It is its own async context (a small class, not an @asynccontextmanager: no generator frames or
    async-generator registration per request, issue 15): entering waits for the slot or exempt place,
    leaving gives an exempt place back."""

    __slots__ = (
        "_arrived", "_delay", "_held", "_pacer", "again", "bound", "host", "klass", "pipeline", "probe",
        "waited",
    )  # fmt: skip

    def __init__(
        self,
        pacer: Turns,
        host: str,
        klass: Klass,
        waited: float = 0.0,
        pipeline: str = DEFAULT_PIPELINE,
        arrived: float | None = None,
        bound: float | None = None,
        again: bool = False,
    ) -> None:
        self._pacer = pacer
        self.bound = bound  # the longest this request may be held (its client's rule); None: max_wait
        self.again = again  # the client's retry of a refused request: ahead of first tries in its line
        self.host = host
        self.klass = klass
        self.waited = waited
        self.pipeline = pipeline  # the name it counted as (bounded: configured, first 50 seen, "other")
        # Set on entering: this grant is the one request after a block that tells whether it still holds
        # (issue 12); its answer reaches the store at once, and the operator log names it.
        self.probe = False
        self._arrived = arrived
        self._held = False  # an exempt place to give back on leaving
        self._delay: Delay | None = None  # what the last answer fed back made the pacer apply

    async def __aenter__(self) -> Permit:
        pacer = self._pacer
        if self._arrived is None:  # the retry decision measures from here (the proxy passes its arrival)
            self._arrived = pacer.monotonic()
        try:
            if self.klass is Klass.EXEMPT:
                self.waited = await pacer._exempt_enter(self.host, self._arrived, self.pipeline, self.bound)
                self._held = True
            else:
                self.waited = await pacer._wait_paced(
                    self.host, self._arrived, self.pipeline, self.bound, self.again
                )
        except WaitTooLong as e:
            e.note = await pacer._rest_note(self.host, e.wait)  # why the host rests: the refusal's text
            raise
        self.probe = pacer._probing(self.host)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._held:
            self._held = False
            self._pacer._exempt_leave(self.host, self.pipeline)

    async def answered(
        self, status: int | None, retry_after: str | None, signal: Signal | None = None
    ) -> Delay | None:
        """Feed the upstream's answer back (``status`` None: the connection failed or timed out).

        ``signal``: the answer's cause (``policy.signals``); an S3 403, a 404 or a local failure records
        nothing. None: read by the status alone.

        The store write runs in a task the pacer owns and is awaited through ``asyncio.shield``: a caller
        cancelled here (its client left) never loses a throttle the upstream already sent.
        """
        self._delay = d = await self._pacer._feedback(self.host, status, retry_after, signal)
        return d

    def retry(self, method: str, has_body: bool, retried: int) -> RetryDecision:
        """After ``answered``: whether to try again on the client's behalf, and after how long.

        ``policy.retry``'s rules on the pacer's settings: a replayable request, after a throttle (never a
        block), fewer than ``pacing.retries`` tries ``retried`` already, and the wait still within
        bound (its client rule's, else ``max_wait``) from the request's arrival (the pacer's clock)."""
        d, s = self._delay, self._pacer.settings
        arrived = self._arrived if self._arrived is not None else self._pacer.monotonic()
        elapsed = self._pacer.monotonic() - arrived
        seconds, blocked = (d.seconds, d.block) if d is not None else (None, False)
        bound = s.max_wait if self.bound is None else self.bound
        return decide_retry(method, has_body, s.retries - retried, elapsed, seconds, bound, blocked)
