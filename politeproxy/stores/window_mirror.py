"""What the failover store knows of each service's shared request window, to seed its fallback with.

A switch to the fallback must never start an empty window (issue 42 item 2): the fallback would let a
whole window's worth go at once, on top of what the shared store had just let go. So, as backoffs are
mirrored, the window is too:

- the shared store's window is read about once a second while it answers (``window_counts``, a snapshot
  of every proxy's grants; from its first answer on, claims or none: the store is told the window at
  start, config/storebuild.py), and every grant this proxy gets from it is counted here as well (the grants
  since the last snapshot are added to it: they are in no snapshot yet); each snapshot is copied into the
  fallback at once (``mirror_window``), so a fallback that outlives the process (the data dir) holds it;
- the first time the fallback paces a service after a switch, it is seeded with those counts
  (``mirror_window``, which keeps per bucket the larger of its own count and the seed's);
- a service nothing was mirrored for (the proxy started while the shared store was down, and its
  fallback holds no copy written within the window's reach) starts full: nothing goes to it for one
  window;
- back on the shared store, the grants this proxy made on the fallback are added to the shared window
  (``add_window``): a Redis restarted empty would else start an empty window the other way. Each proxy
  adds only its own, which no other copy holds, so the sum is exact.

All times here are on the failover store's monotonic clock; they cross to the fallback as relative counts.
What a snapshot cannot hold are other proxies' grants in the last second before the outage (at most the
shared rate for a second); the fallback's divided limit (``window.divided``) covers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from politeproxy.policy import window
from politeproxy.policy.services import SERVICE_HOST
from politeproxy.policy.window import Relative, WindowRule, WindowState
from politeproxy.stores.base import FailoverSide, StoreError

log = logging.getLogger("politeproxy.store")
MAX_SERVICES = 64  # windows remembered (services are a handful; a fence, not a cache)
READ_EVERY = 1.0  # seconds between snapshots of the shared windows
NAMED = tuple(SERVICE_HOST.values())  # the named services' window records (policy.services.service_key)


class WindowMirror:
    """A failover store's copy of the shared request windows: its own grants, the last snapshot read from
    the primary, what it seeded into the fallback since the switch, and the fallback's grants still to be
    handed back (see the module's text)."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        self.rules: dict[str, WindowRule] = {}  # the services seen, with their rule
        self.own: dict[str, WindowState] = {}  # this proxy's grants from the shared store
        self.since: dict[str, WindowState] = {}  # ... those since the last snapshot began
        self.pending: dict[str, WindowState] | None = None  # ... those since the snapshot being read began
        self.snaps: dict[str, tuple[float, Relative]] = {}  # the shared window as read, and when
        self.seeded: set[str] = set()  # services seeded into the fallback since the last switch
        self.local: dict[str, WindowState] = {}  # this proxy's grants from the fallback, not handed back
        self.last_read = -READ_EVERY
        self._reader: asyncio.Task[None] | None = None  # the snapshot read in flight (read_when_due)

    def watch(self, rule: WindowRule) -> None:
        self._remember(rule)

    def _remember(self, rule: WindowRule) -> None:
        """Keep ``rule``, and the same window for every named service: their shared windows are read from
        the first claim on, so a service this proxy has not sent to yet has a copy too."""
        if self.rules.get(rule.service) == rule:
            return
        for service in (rule.service, *NAMED):
            if service not in self.rules and len(self.rules) >= MAX_SERVICES:
                gone = next(iter(self.rules))
                for table in (self.rules, self.own, self.since, self.snaps, self.local):
                    table.pop(gone, None)
            if service == rule.service or self.rules.get(service, rule).seconds != rule.seconds:
                self.rules[service] = replace(rule, service=service)
            else:
                self.rules.setdefault(service, replace(rule, service=service))

    def granted(self, rule: WindowRule | None, wait: float) -> None:
        """The shared store granted a slot ``wait`` seconds from now in ``rule``'s window."""
        if rule is None or not rule.on:
            return
        self._remember(rule)
        now = self.monotonic()
        tables = [self.own, self.since] + ([] if self.pending is None else [self.pending])
        for table in tables:
            st = table.get(rule.service, WindowState())
            if len(st.buckets) > window.BUCKETS:  # keep it small: drop what left the window
                st = window.live(st, now, rule)[0]
            table[rule.service] = window.record(st, now + max(0.0, wait), rule)

    def granted_locally(self, rule: WindowRule | None, wait: float) -> None:
        """The fallback granted a slot ``wait`` seconds from now (the shared store was down)."""
        if rule is None or not rule.on:
            return
        self._remember(rule)
        now = self.monotonic()
        st = self.local.get(rule.service, WindowState())
        if len(st.buckets) > window.BUCKETS:
            st = window.live(st, now, rule)[0]
        self.local[rule.service] = window.record(st, now + max(0.0, wait), rule)

    async def hand_back(self, primary: FailoverSide) -> None:
        """Add the fallback's grants to the shared windows (the shared store answers again)."""
        for service in list(self.local):
            rule = self.rules.get(service)
            st = self.local.get(service)
            if rule is not None and st is not None:
                now = self.monotonic()
                counts = window.relative(window.live(st, now, rule)[0], now, rule)
                try:
                    await primary.add_window(rule, counts)
                except NotImplementedError:
                    pass  # a store that keeps no window
            self.local.pop(service, None)

    def due(self) -> bool:
        return bool(self.rules) and self.monotonic() - self.last_read >= READ_EVERY

    def read_when_due(
        self, primary: FailoverSide, fallback: FailoverSide, degraded: Callable[[], bool]
    ) -> None:
        """When a read is due and none is in flight: snapshot the shared windows in the background, and copy
        them into the fallback while the primary answers (as backoffs are mirrored)."""
        if self.due() and (self._reader is None or self._reader.done()):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside the loop (a test): the next call on it reads
                return
            self._reader = loop.create_task(self._copy(primary, fallback, degraded))

    async def _copy(
        self, primary: FailoverSide, fallback: FailoverSide, degraded: Callable[[], bool]
    ) -> None:
        try:
            await self.read(primary)
            for rule in list(self.rules.values()):
                if not degraded() and (counts := self.counts(rule)) is not None:
                    await fallback.mirror_window(rule, counts)
        except (StoreError, OSError, ConnectionError, NotImplementedError) as e:  # the claims find out
            log.debug("could not mirror the windows of %s: %r", primary.name, e)  # the last copy stays

    async def stop(self) -> None:
        """Cancel the read in flight, if any (the failover store's close)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None

    async def read(self, primary: FailoverSide) -> None:
        """Snapshot every service's shared window; a failed read keeps the last snapshot (and the grants
        since it)."""
        self.last_read = self.monotonic()
        self.pending = {}
        try:
            for service, rule in list(self.rules.items()):
                taken = self.monotonic()
                counts = await primary.window_counts(rule)
                self.snaps[service] = (taken, counts)
                self.since[service] = self.pending.pop(service, WindowState())
        finally:
            self.pending = None

    def counts(self, rule: WindowRule) -> Relative | None:
        """What the shared window held, as relative counts now; None when nothing was ever mirrored."""
        now = self.monotonic()
        snap = self.snaps.get(rule.service)
        if snap is not None and now - snap[0] > rule.reach:
            snap = None  # read longer ago than the window: it says nothing of the window now
        own = self.own.get(rule.service)
        if snap is None and own is None:
            return None
        if snap is None:
            assert own is not None
            return window.relative(window.live(own, now, rule)[0], now, rule)
        taken, rel = snap
        aged = tuple((r - (now - taken), c) for r, c in rel)
        base = window.merged(WindowState(rule.width), aged, now, rule)
        extra = window.live(self.since.get(rule.service, WindowState()), now, rule)[0]
        summed = dict(base.buckets)
        for i, c in extra.buckets:  # granted after the snapshot began: in it at most once, added
            summed[i] = summed.get(i, 0) + c
        return window.relative(WindowState(rule.width, tuple(sorted(summed.items()))), now, rule)

    async def seed(self, fallback: FailoverSide, rule: WindowRule | None) -> None:
        """Before the fallback paces ``rule``'s service for the first time since the switch: give it what
        the shared window held, or a full window when nothing was mirrored."""
        if rule is None or not rule.on or rule.service in self.seeded:
            return
        counts = self.counts(rule)
        if counts is None and await fallback.window_known(rule):
            self.seeded.add(rule.service)  # it holds a recent copy (mirrored before this process started)
            return
        if counts is None:
            log.warning(
                "no copy of the request window of %s from the shared store: it starts full on %s (nothing "
                "goes to it for %g s)", rule.service, fallback.name, rule.reach,
            )  # fmt: skip
            counts = window.full(rule)
        await fallback.mirror_window(rule, counts)
        self._remember(rule)
        self.seeded.add(rule.service)
