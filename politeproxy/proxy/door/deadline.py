"""``Deadline``: a served connection's one time bound (the head, idle or linger), cheap to move later.

A keep-alive request moves its connection's bound twice (the head's, then idle again). Cancelling a timer
and making a new one each time cost two timer handles per request (issue 44: the small-GET path); here a
bound moved later keeps the timer already set, which fires first and sets itself again for the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

EARLY = 0.002  # seconds


class Deadline:
    """At most one timer; ``due``: the loop time the bound ends (0: none); ``then`` runs when it ends."""

    __slots__ = ("timer", "due", "then", "default")

    def __init__(self, default: Callable[[], None]) -> None:
        self.timer: asyncio.TimerHandle | None = None
        self.due = 0.0
        self.default = default
        self.then = default

    def set(self, seconds: float, then: Callable[[], None] | None = None) -> None:
        """End the bound ``seconds`` from now (``then``, else the default, runs); 0 lifts it."""
        if seconds <= 0:
            self.due = 0.0
            return
        loop = asyncio.get_running_loop()
        self.due = due = loop.time() + seconds
        self.then = then or self.default
        t = self.timer
        if t is not None:
            if t.when() <= due:
                return  # it fires first and sets itself again for the rest
            t.cancel()
        self.timer = loop.call_at(due, self._fire)

    def stop(self) -> None:
        """Lift the bound and drop the timer too (a closed connection is not kept until it fires)."""
        self.due = 0.0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self) -> None:
        self.timer = None
        due = self.due
        if not due:
            return
        loop = asyncio.get_running_loop()
        # moved later since it was set: again for the rest (a loop that fires up to EARLY before the time,
        # as uvloop's whole milliseconds do, has ended a connection's bound close enough)
        if loop.time() + EARLY < due:
            self.timer = loop.call_at(due, self._fire)
            return
        self.due = 0.0
        self.then()
