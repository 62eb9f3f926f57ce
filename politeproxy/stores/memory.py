"""In-process store: one proxy, one budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from politeproxy.policy import backoff, slots
from politeproxy.policy.backoff import BackoffPolicy, Delay
from politeproxy.policy.slots import Claim, HostState
from politeproxy.stores.base import HostView, Store, jitter_source


class StateMachine:
    """The store logic over plain values, shared by the memory and file stores."""

    def __init__(self, clock: Callable[[], float], rand: Callable[[], float] = jitter_source) -> None:
        self.clock = clock
        self.rand = rand

    def claim(
        self, global_next: float, host: HostState, gap: float, interval: float, max_wait: float | None
    ) -> tuple[Claim, float, HostState]:
        now = self.clock()
        # A record far in the future means the wall clock jumped back: trust now, not the record.
        if global_next > now + max(3600.0, gap * 100_000):
            global_next = now
        deadline = None if max_wait is None else now + max_wait
        return slots.claim(now, global_next, gap, host, interval, deadline)

    def throttled(
        self, host: HostState, retry_after: float | None, policy: BackoffPolicy
    ) -> tuple[Delay, HostState]:
        now = self.clock()
        if host.backoff_until > now + policy.cap * 2:
            host = replace(host, backoff_until=now)
        delay = backoff.throttle_delay(host.throttles, retry_after, policy, self.rand())
        return delay, backoff.apply_throttle(host, now, delay.seconds)

    def view(self, host: HostState) -> HostView:
        now = self.clock()
        return HostView(
            ready_in=max(0.0, host.ready_at() - now),
            backoff_in=max(0.0, host.backoff_until - now),
            throttles=host.throttles,
            crawl_delay=host.crawl_delay,
            robots_fresh=host.robots_expires > now,
        )

    def with_crawl_delay(self, host: HostState, delay: float, ttl: float) -> HostState:
        return replace(host, crawl_delay=delay, robots_expires=self.clock() + ttl)


class MemoryStore(Store):
    name = "memory"

    def __init__(self, clock: Callable[[], float] = time.time, rand: Callable[[], float] = jitter_source):
        self.sm = StateMachine(clock, rand)
        self.global_next = 0.0
        self.count = 0
        self.hosts: dict[str, HostState] = {}

    async def claim(self, host: str, gap: float, interval: float, max_wait: float | None) -> Claim:
        c, self.global_next, self.hosts[host] = self.sm.claim(
            self.global_next, self.hosts.get(host, HostState()), gap, interval, max_wait
        )
        if c.granted:
            self.count += 1
        return c

    async def throttled(self, host: str, retry_after: float | None, policy: BackoffPolicy) -> Delay:
        delay, self.hosts[host] = self.sm.throttled(self.hosts.get(host, HostState()), retry_after, policy)
        return delay

    async def succeeded(self, host: str) -> None:
        if host in self.hosts:
            self.hosts[host] = backoff.apply_success(self.hosts[host])

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        self.hosts[host] = self.sm.with_crawl_delay(self.hosts.get(host, HostState()), delay, ttl)

    async def host_view(self, host: str) -> HostView:
        return self.sm.view(self.hosts.get(host, HostState()))

    async def grants(self) -> int:
        return self.count
