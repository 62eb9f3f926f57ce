"""In-process store: one proxy, one budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from politeproxy.policy import backoff, slots, window
from politeproxy.policy.backoff import BackoffPolicy, Delay, Kind
from politeproxy.policy.fairclaim import FairAsk, FairState, fair_charge, fair_gate
from politeproxy.policy.slots import MAX_BACKOFF, MAX_DURATION, Bounds, Claim, HostState, Outcome, duration
from politeproxy.policy.window import Relative, WindowRule, WindowState
from politeproxy.stores.base import FailoverSide, HostView, WarnOnce, jitter_source, other_ceiling

# Outside a claim the host's interval is unknown: bound next_allowed by the longest interval a config may
# give, so a throttle or a view never cuts a legitimate interval short (0xFF bytes are still far beyond).
LOOSE = Bounds(step=MAX_DURATION)


class StateMachine:
    """The store logic over plain values, shared by the memory and file stores.

    Every record handed in is checked against the sanity bounds (``slots.Bounds``) first: a time that cannot
    be legitimate is treated as now and logged once, so a corrupt file or a clock step back never stalls
    pacing for longer than the longest legitimate wait.
    """

    def __init__(
        self, clock: Callable[[], float], rand: Callable[[], float] = jitter_source, name: str = "memory"
    ) -> None:
        self.clock = clock
        self.rand = rand
        self.name = name
        self.max_backoff = MAX_BACKOFF
        self.warn = WarnOnce()
        self.last_next = 0.0  # the global next this process wrote last (see slots.sane_global)
        self._bounds = Bounds()  # the last claim's bounds, kept while the settings stay

    def check_global(self, global_next: float, now: float, b: Bounds) -> float:
        sane, ok = slots.sane_global(global_next, now, b, self.last_next)
        if not ok:
            msg = (
                "%s store: the global next slot (%r s from now) is beyond %.0f s ahead; treated as now + gap"
            )
            self.warn("global", msg, self.name, global_next - now, b.schedule())
        return sane

    def check_host(self, host: HostState, now: float, b: Bounds) -> HostState:
        sane, ok = slots.sane_host(host, now, b)
        if not ok:
            msg = (
                "%s store: a host record holds times or values no legitimate wait gives (%r); treated as now"
            )
            self.warn("host", msg, self.name, host)
        return sane

    def claim(
        self,
        global_next: float,
        host: HostState,
        gap: float,
        interval: float,
        max_wait: float | None,
        not_before: float = 0.0,
    ) -> tuple[Claim, float, HostState]:
        now = self.clock()
        gap, interval = duration(gap), duration(interval)
        b = self._bounds
        if (b.gap, b.step, b.backoff) != (gap, interval, self.max_backoff):  # a frozen dataclass per claim
            b = self._bounds = Bounds(gap, interval, self.max_backoff)  # otherwise: the settings' one
        global_next = self.check_global(global_next, now, b)
        host = self.check_host(host, now, b)
        deadline = None if max_wait is None else now + duration(max_wait)
        earliest = now + duration(not_before)
        c, new_next, new_host = slots.claim(now, global_next, gap, host, interval, deadline, earliest)
        if c.granted and gap > 0:
            self.last_next = new_next
        return c, new_next, new_host

    def exempt_claim(
        self,
        host: HostState,
        rate: float,
        burst: int,
        max_wait: float | None,
        hold: bool = True,
        ceiling: HostState | None = None,
    ) -> tuple[Claim, HostState, HostState | None]:
        """The claim, the new host state and (with ``ceiling``, the record holding the GCRA state) the new
        ceiling state."""
        now = self.clock()
        loose = replace(LOOSE, backoff=self.max_backoff)
        host = self.check_host(host, now, loose)
        deadline = None if max_wait is None else now + duration(max_wait)
        if ceiling is None:
            return (*slots.exempt_claim(now, host, duration(rate), max(1, burst), deadline, hold), None)
        ceiling = self.check_host(ceiling, now, loose)
        return slots.exempt_claim_split(now, host, ceiling, duration(rate), max(1, burst), deadline, hold)

    def windowed(
        self, c: Claim, state: WindowState, rule: WindowRule | None, max_wait: float | None
    ) -> tuple[Claim, WindowState | None]:
        """A claim passed through the service's request window (``policy.window.gate``): the claim, and
        the window to write: with the slot counted when granted; bounded when the record was not sane or
        of another width, granted or not (left as it was, a corrupt bucket far ahead would be bounded anew
        against each later now, a bucket further every time, and hold the service for good); else None."""
        if rule is None or not rule.on or not c.granted:
            return c, None
        now = self.clock()
        st, ok = window.live(state, now, rule)
        if not ok:
            msg = "%s store: the request window of %s holds counts no legitimate use gives; bounded"
            self.warn("window", msg, self.name, rule.service)
        deadline = None if max_wait is None else now + duration(max_wait)
        c, counted = window.gate(c, now, st, rule, deadline)
        moved = bool(state.buckets) and not abs(state.width - rule.width) <= window.SAME_WIDTH
        if counted is None and (not ok or moved):
            return c, st
        return c, counted

    def window_used(self, state: WindowState, rule: WindowRule) -> int:
        now = self.clock()
        return window.used(window.live(state, now, rule)[0], now, rule)

    def window_counts(self, state: WindowState, rule: WindowRule) -> Relative:
        if not rule.on:
            return ()
        now = self.clock()
        return window.relative(window.live(state, now, rule)[0], now, rule)

    def window_mirrored(
        self, state: WindowState | None, rule: WindowRule, counts: Relative, add: bool = False
    ) -> WindowState:
        """The window holding at least ``counts`` too (the shared store's mirror), or ``counts`` added."""
        now = self.clock()
        return window.merged(window.live(state or WindowState(), now, rule)[0], counts, now, rule, add)

    def throttled(
        self,
        host: HostState,
        retry_after: float | None,
        policy: BackoffPolicy,
        kind: Kind = Kind.THROTTLE,
        base: float = 0.0,
    ) -> tuple[Delay, HostState]:
        now = self.clock()
        host = self.check_host(host, now, replace(LOOSE, backoff=self.max_backoff))
        ra = None if retry_after is None else duration(retry_after)
        delay = backoff.answer_delay(host, kind, ra, policy, self.rand())
        return delay, backoff.apply_answer(host, now, kind, delay, duration(base), policy)

    def succeeded(self, host: HostState) -> HostState:
        return backoff.apply_success(self.checked(host), self.clock())

    def held(self, host: HostState, seconds: float) -> HostState:
        """The host with its backoff pushed out to at least ``seconds`` from now (a mirrored backoff)."""
        now = self.clock()
        host = self.check_host(host, now, replace(LOOSE, backoff=self.max_backoff))
        until = now + duration(seconds, self.max_backoff)
        return host if host.backoff_until >= until else replace(host, backoff_until=until)

    def released(self, host: HostState) -> HostState:
        return replace(
            self.checked(host), backoff_until=0.0, throttles=0, blocks=0, fails=0, probe_until=0.0,
            adapt_interval=0.0, adapt_from=0.0, adapt_until=0.0,
        )  # fmt: skip

    def checked(self, host: HostState) -> HostState:
        return self.check_host(host, self.clock(), replace(LOOSE, backoff=self.max_backoff))

    def view(self, host: HostState) -> HostView:
        now = self.clock()
        host = self.check_host(host, now, replace(LOOSE, backoff=self.max_backoff))
        return HostView(
            ready_in=max(0.0, host.ready_at() - now),
            backoff_in=max(0.0, host.backoff_until - now),
            throttles=host.throttles,
            crawl_delay=host.crawl_delay,
            robots_fresh=host.robots_expires > now,
            blocks=host.blocks,
            probe_in=max(0.0, host.probe_until - now),
            adapt_interval=host.adapt_interval,
            adapt_from_in=host.adapt_from - now,
            adapt_until_in=host.adapt_until - now,
        )

    def with_crawl_delay(self, host: HostState, delay: float, ttl: float) -> HostState:
        host = self.checked(host)
        ttl = duration(ttl, slots.MAX_ROBOTS_TTL)
        return replace(
            host, crawl_delay=duration(delay, slots.MAX_CRAWL_DELAY), robots_expires=self.clock() + ttl
        )


class MemoryStore(FailoverSide):
    """Pacing for this process alone. Its clock is monotonic by default: nobody else reads its records, so a
    wall-clock step back (NTP, a VM resumed) cannot stall it."""

    name = "memory"

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = jitter_source,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        self.sm = StateMachine(clock, rand, self.name)
        self.sm.max_backoff = duration(max_backoff, MAX_BACKOFF)
        self.global_next = 0.0
        self.count = 0
        self.hosts: dict[str, HostState] = {}
        self.windows: dict[str, WindowState] = {}  # service -> its request window (a few named services)
        self.window_written: dict[str, float] = {}  # service -> when its window was last written (clock)
        self.fair = FairState()  # pipelines' turns, for dispatchers sharing this object (tests, simulate)

    async def claim(
        self,
        host: str,
        gap: float,
        interval: float,
        max_wait: float | None,
        not_before: float = 0.0,
        window: WindowRule | None = None,
        fair: FairAsk | None = None,
    ) -> Claim:
        c, new_next, new_host = self.sm.claim(
            self.global_next, self.hosts.get(host, HostState()), gap, interval, max_wait, not_before
        )
        c = fair_gate(self.fair, c, fair, duration(gap), self.sm.clock())
        if c.outcome is Outcome.NOT_YOUR_TURN:  # nothing reserved, nothing counted
            return c
        c, counted = self._windowed(c, window, max_wait)
        if counted is not None and window is not None:
            self._put_window(window, counted)  # the slot counted, or a stray record bounded
        if c.window:  # the window has no room: nothing reserved
            return c
        self.global_next, self.hosts[host] = new_next, new_host  # a corrupt record's sane form too
        if c.granted:
            self.count += 1
            self.note_probe(host, c)
            if fair is not None and duration(gap) > 0:
                fair_charge(self.fair, fair)
        return c

    def _windowed(
        self, c: Claim, rule: WindowRule | None, max_wait: float | None
    ) -> tuple[Claim, WindowState | None]:
        if rule is None:
            return c, None
        return self.sm.windowed(c, self.windows.get(rule.service, WindowState()), rule, max_wait)

    async def window_used(self, rule: WindowRule) -> int:
        return self.sm.window_used(self.windows.get(rule.service, WindowState()), rule)

    async def window_counts(self, rule: WindowRule) -> Relative:
        return self.sm.window_counts(self.windows.get(rule.service, WindowState()), rule)

    def _put_window(self, rule: WindowRule, state: WindowState) -> None:
        self.windows[rule.service] = state
        self.window_written[rule.service] = self.sm.clock()

    async def mirror_window(self, rule: WindowRule, counts: Relative) -> None:
        if rule.on:
            self._put_window(rule, self.sm.window_mirrored(self.windows.get(rule.service), rule, counts))

    async def add_window(self, rule: WindowRule, counts: Relative) -> None:
        if rule.on:
            old = self.windows.get(rule.service)
            self._put_window(rule, self.sm.window_mirrored(old, rule, counts, add=True))

    async def window_known(self, rule: WindowRule) -> bool:
        at = self.window_written.get(rule.service)
        return at is not None and 0.0 <= self.sm.clock() - at <= rule.reach

    async def exempt_claim(
        self,
        host: str,
        rate: float,
        burst: int,
        max_wait: float | None,
        hold: bool = True,
        ceiling: str | None = None,
        window: WindowRule | None = None,
    ) -> Claim:
        key = other_ceiling(host, ceiling)
        other = None if key is None else self.hosts.get(key, HostState())
        c, new, new_ceiling = self.sm.exempt_claim(
            self.hosts.get(host, HostState()), rate, burst, max_wait, hold, other
        )
        c, counted = self._windowed(c, window, max_wait)
        if counted is not None and window is not None:
            self._put_window(window, counted)
        if c.granted:
            self.hosts[host] = new
            if key is not None and new_ceiling is not None:
                self.hosts[key] = new_ceiling
            self.note_probe(host, c)
        return c

    async def throttled(
        self,
        host: str,
        retry_after: float | None,
        policy: BackoffPolicy,
        kind: Kind = Kind.THROTTLE,
        base: float = 0.0,
    ) -> Delay:
        self.probe_answered(host)
        old = self.hosts.get(host, HostState())
        delay, self.hosts[host] = self.sm.throttled(old, retry_after, policy, kind, base)
        return delay

    async def mirror_backoff(self, host: str, seconds: float) -> None:
        self.hosts[host] = self.sm.held(self.hosts.get(host, HostState()), seconds)

    async def succeeded(self, host: str) -> None:
        self.probe_answered(host)
        if host in self.hosts:
            self.hosts[host] = self.sm.succeeded(self.hosts[host])

    async def release(self, host: str) -> None:
        self.probe_answered(host)
        if host in self.hosts:
            self.hosts[host] = self.sm.released(self.hosts[host])

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        self.hosts[host] = self.sm.with_crawl_delay(self.hosts.get(host, HostState()), delay, ttl)

    async def host_view(self, host: str) -> HostView:
        return self.sm.view(self.hosts.get(host, HostState()))

    async def grants(self) -> int:
        return self.count
