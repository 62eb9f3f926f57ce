"""This proxy's heartbeat (issue 27 item 2): every ``BEAT_EVERY`` seconds it writes its record beside the
shared schedule, reads everyone's, keeps the live ones for ``/status`` and gives their count to the
failover store (the degraded-mode gap multiplier).

Each process beats as its own entry, each worker of ``run --workers N`` too: each paces alone when the
shared store goes down, so each is one proxy in the multiplier.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from politeproxy import __version__
from politeproxy.pacing.pacer import Pacer
from politeproxy.policy.heartbeat import BEAT_EVERY, Beat, live, make_beat, proxy_id
from politeproxy.stores.base import WarnOnce
from politeproxy.stores.heartbeats import Beats, alone

log = logging.getLogger("politeproxy.store")


class Announcer:
    """Writes this proxy's heartbeat beside the schedule, reads every proxy's, and tells ``live`` (the
    failover store's ``note_live``, from the store set) their count; ``rows`` lists them for /status."""

    def __init__(
        self,
        beats: Beats,
        pacer: Pacer,
        listen: str,
        live: Callable[[int], float] = alone,
        clock: Callable[[], float] = time.time,
        every: float = BEAT_EVERY,
        ident: str | None = None,
        on_count: Callable[[int, float], None] | None = None,
    ) -> None:
        self.beats = beats
        self.pacer = pacer
        self.live = live  # (live proxies) -> the gap multiplier the fallback would pace with
        self.listen = listen
        self.clock = clock
        self.every = every
        self.started = clock()
        self.id = ident or proxy_id(socket.gethostname(), os.getpid(), self.started)
        self.peers: list[Beat] = []
        self.on_count = on_count  # (live proxies, fallback gap multiplier) after each beat: the gauges
        self._warn = WarnOnce()

    def _mine(self, now: float) -> Beat:
        snap = self.pacer.snapshot()
        names = [*snap.weights, *snap.queued_by_pipeline]
        return make_beat(self.id, self.listen, __version__, now, self.started, snap.queued_by_pipeline, names)

    async def beat(self) -> None:
        """One beat: write, read, count. A store that fails keeps the last count (and the last peers)."""
        now = self.clock()
        mine = self._mine(now)
        try:
            await self.beats.put(mine)
            found = await self.beats.read(now)
        except Exception as e:  # noqa: BLE001 - advisory: pacing does not depend on it
            self._warn("beat", "could not write or read proxy heartbeats: %r", e)
            self.peers = live([*self.peers, mine], now)
            return
        self.peers = live([*found, mine], now)
        mult = self.live(len(self.peers))
        if self.on_count:
            self.on_count(len(self.peers), mult)

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.every)

    def rows(self) -> list[dict[str, Any]]:
        """The live proxies for /status (this one included, marked ``self``)."""
        now = self.clock()
        mine = self._mine(now)
        return [b.row(now, self.id) for b in live([*self.peers, mine], now)]

    async def stop(self) -> None:
        """A clean stop removes its record at once, so the others count one fewer now, not in 6 s."""
        try:
            async with asyncio.timeout(1.0):  # a store that hangs must not hold up the stop
                await self.beats.drop(self.id)
        except Exception as e:  # noqa: BLE001 - advisory; the record expires anyway
            self._warn("drop", "could not remove this proxy's heartbeat: %r", e)
