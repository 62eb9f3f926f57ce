"""A store in Redis, shared by every proxy on every machine pointed at the same server and prefix.

Each decision is one Lua script, so it is atomic on the server, and each reads the server's ``TIME``, so
machines whose clocks disagree still share one schedule. Times are kept as integer microseconds since the
epoch (about 1.7e15, well below 2**53, so Lua's doubles hold them exactly) and written with ``%.0f`` so
they are never rounded by Lua's 14-digit ``tostring``.

Keys: ``{prefix}global`` (hash: ``next``, ``count``) and ``{prefix}host:{host}`` (hash: ``next_allowed``,
``backoff_until``, ``throttles``, ``crawl_delay``, ``robots_expires``). Every write sets a TTL of
``key_ttl`` past the last future time the key holds, so stale state expires but live state never does.
A Redis Cluster needs both keys in one slot: put a hash tag in the prefix, e.g. ``{politeproxy}:``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from politeproxy.policy import backoff
from politeproxy.policy.backoff import BackoffPolicy, Delay
from politeproxy.policy.slots import Claim, Outcome
from politeproxy.stores.base import HostView, Store, StoreError, jitter_source

T = TypeVar("T")
US = 1_000_000

# Shared Lua prelude: the server clock in microseconds, exact integer formatting, and the TTL rule.
_PRELUDE = """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(x)
  return string.format('%.0f', x)
end
local function num(x)
  return tonumber(x) or 0
end
-- keep a key key_ttl past the furthest future time it holds
local function keep(key, now, ttl_ms, furthest)
  local ahead = math.max(0, furthest - now)
  redis.call('PEXPIRE', key, fmt(ttl_ms + math.ceil(ahead / 1000)))
end
local function host_furthest(key)
  local h = redis.call('HMGET', key, 'next_allowed', 'backoff_until', 'robots_expires')
  return math.max(num(h[1]), num(h[2]), num(h[3]))
end
"""

# KEYS: global, host. ARGV: gap_us, interval_us, max_wait_us ('' = none), key_ttl_ms.
# Returns {outcome (0 granted, 1 host not ready, 2 too late), wait_us, at_us}; mirrors slots.claim.
_CLAIM = (
    _PRELUDE
    + """
local now = now_us()
local gap = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local deadline = nil
if ARGV[3] ~= '' then deadline = now + tonumber(ARGV[3]) end
local ttl_ms = tonumber(ARGV[4])

local gnext = num(redis.call('HGET', KEYS[1], 'next'))
local jumped = false
-- a record far in the future means the server clock jumped back: trust now (as StateMachine.claim)
if gnext > now + math.max(3600 * 1000000, gap * 100000) then
  gnext = now
  jumped = true
end
local h = redis.call('HMGET', KEYS[2], 'next_allowed', 'backoff_until', 'crawl_delay')
local next_allowed, backoff_until, crawl_delay = num(h[1]), num(h[2]), num(h[3])

local slot = now
if gap > 0 then slot = math.max(now, gnext) end
local ready = math.max(next_allowed, backoff_until)
if ready > slot then
  if deadline ~= nil and ready > deadline then return {2, ready - now, ready} end
  return {1, ready - now, ready}
end
if deadline ~= nil and slot > deadline then return {2, slot - now, slot} end

local new_next = gnext
if gap > 0 then new_next = slot + gap end
if gap > 0 or jumped then redis.call('HSET', KEYS[1], 'next', fmt(new_next)) end
redis.call('HINCRBY', KEYS[1], 'count', 1)
keep(KEYS[1], now, ttl_ms, new_next)

local step = math.max(interval, crawl_delay)
if step > 0 then
  redis.call('HSET', KEYS[2], 'next_allowed', fmt(slot + step))
  keep(KEYS[2], now, ttl_ms, host_furthest(KEYS[2]))
end
return {0, slot - now, slot}
"""
)

# KEYS: host. ARGV: key_ttl_ms. Counts the throttle and returns the count before it (what the delay uses).
_THROTTLE_COUNT = (
    _PRELUDE
    + """
local before = redis.call('HINCRBY', KEYS[1], 'throttles', 1) - 1
keep(KEYS[1], now_us(), tonumber(ARGV[1]), host_furthest(KEYS[1]))
return before
"""
)

# KEYS: host. ARGV: delay_us, cap_us, key_ttl_ms. Pushes backoff_until out to at least now + delay.
_THROTTLE_APPLY = (
    _PRELUDE
    + """
local now = now_us()
local delay, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local until_ = num(redis.call('HGET', KEYS[1], 'backoff_until'))
-- beyond twice the cap can only come from a clock jump: trust now (as StateMachine.throttled)
if until_ > now + 2 * cap then until_ = now end
until_ = math.max(until_, now + delay)
redis.call('HSET', KEYS[1], 'backoff_until', fmt(until_))
keep(KEYS[1], now, tonumber(ARGV[3]), host_furthest(KEYS[1]))
return until_ - now
"""
)

# KEYS: host. Resets the throttle count without creating a key (a key without a TTL would live forever).
_SUCCEEDED = """
local n = tonumber(redis.call('HGET', KEYS[1], 'throttles')) or 0
if n ~= 0 then redis.call('HSET', KEYS[1], 'throttles', 0) end
return n
"""

# KEYS: host. ARGV: crawl_delay_us, robots_ttl_us, key_ttl_ms.
_SET_CRAWL_DELAY = (
    _PRELUDE
    + """
local now = now_us()
redis.call('HSET', KEYS[1], 'crawl_delay', fmt(tonumber(ARGV[1])),
  'robots_expires', fmt(now + tonumber(ARGV[2])))
keep(KEYS[1], now, tonumber(ARGV[3]), host_furthest(KEYS[1]))
return 1
"""
)

# KEYS: host. Returns {now, next_allowed, backoff_until, throttles, crawl_delay, robots_expires}.
_HOST_VIEW = (
    _PRELUDE
    + """
local h = redis.call('HMGET', KEYS[1], 'next_allowed', 'backoff_until', 'throttles', 'crawl_delay',
  'robots_expires')
return {now_us(), num(h[1]), num(h[2]), num(h[3]), num(h[4]), num(h[5])}
"""
)

_OUTCOMES = {0: Outcome.GRANTED, 1: Outcome.HOST_NOT_READY, 2: Outcome.TOO_LATE}


def _us(seconds: float) -> int:
    """Seconds to whole microseconds; a positive value never rounds down to 0 (0 means "off")."""
    if seconds <= 0:
        return 0
    return max(1, round(seconds * US))


class RedisStore(Store):
    name = "redis"

    def __init__(
        self,
        url: str,
        prefix: str = "politeproxy:",
        key_ttl: float = 86400.0,
        rand: Callable[[], float] = jitter_source,
        socket_timeout: float = 1.0,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.key_ttl_ms = max(1, round(key_ttl * 1000))
        self.rand = rand
        self.socket_timeout = socket_timeout
        # redis-py bounds each read/connect; this bounds a whole call (retry, NOSCRIPT reload: 3 round
        # trips), so a half-dead server costs at most this before the failover store takes over.
        self.call_timeout = 3.0 * socket_timeout
        # One immediate retry on a connection error only: it heals a pooled connection that a Redis
        # restart left dead. No retry on timeout, which would double the stall; and the default
        # exponential backoff would hold a request for seconds when it should fail over.
        self.client: aioredis.Redis = aioredis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._claim = self.client.register_script(_CLAIM)
        self._throttle_count = self.client.register_script(_THROTTLE_COUNT)
        self._throttle_apply = self.client.register_script(_THROTTLE_APPLY)
        self._succeeded = self.client.register_script(_SUCCEEDED)
        self._set_crawl_delay = self.client.register_script(_SET_CRAWL_DELAY)
        self._host_view = self.client.register_script(_HOST_VIEW)

    @property
    def global_key(self) -> str:
        return f"{self.prefix}global"

    def host_key(self, host: str) -> str:
        return f"{self.prefix}host:{host}"

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self.call_timeout):
                return await fn()
        except (RedisError, OSError, TimeoutError) as e:
            # A timeout here may leave a claim applied whose answer was lost: one slot goes unused,
            # which errs on the polite side.
            raise StoreError(f"redis {what}: {e!r}") from e

    async def _script(
        self, what: str, script: AsyncScript, keys: Sequence[str], args: Sequence[int | str]
    ) -> Any:
        return await self._call(what, lambda: script(keys=list(keys), args=list(args)))

    # -- Store ------------------------------------------------------------------------------------

    async def claim_with_server_time(
        self, host: str, gap: float, interval: float, max_wait: float | None
    ) -> tuple[Claim, float]:
        """Like :meth:`claim`, plus the slot in the server's clock (exact; for tests and diagnostics)."""
        args = [_us(gap), _us(interval), "" if max_wait is None else round(max_wait * US), self.key_ttl_ms]
        code, wait_us, at_us = await self._script(
            "claim", self._claim, [self.global_key, self.host_key(host)], args
        )
        wait = int(wait_us) / US
        # The slot is in the server's clock; ``at`` is re-based on the local one so local code can use it.
        return Claim(_OUTCOMES[int(code)], wait, time.time() + wait), int(at_us) / US

    async def claim(self, host: str, gap: float, interval: float, max_wait: float | None) -> Claim:
        return (await self.claim_with_server_time(host, gap, interval, max_wait))[0]

    async def throttled(self, host: str, retry_after: float | None, policy: BackoffPolicy) -> Delay:
        key = self.host_key(host)
        # Two scripts so the delay arithmetic stays in backoff.throttle_delay. Counting first gives two
        # proxies throttled at once consecutive counts, as if serial. Benign races: a success landing
        # between the scripts resets the count, yet this backoff still applies; a proxy dying between
        # them leaves the count one higher, so the next backoff is longer, never shorter.
        before = await self._script("throttled", self._throttle_count, [key], [self.key_ttl_ms])
        delay = backoff.throttle_delay(int(before), retry_after, policy, self.rand())
        await self._script(
            "throttled", self._throttle_apply, [key], [_us(delay.seconds), _us(policy.cap), self.key_ttl_ms]
        )
        return delay

    async def succeeded(self, host: str) -> None:
        await self._script("succeeded", self._succeeded, [self.host_key(host)], [])

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        args = [_us(delay), round(ttl * US), self.key_ttl_ms]
        await self._script("set_crawl_delay", self._set_crawl_delay, [self.host_key(host)], args)

    async def host_view(self, host: str) -> HostView:
        now, next_allowed, until, throttles, crawl_delay, robots = (
            int(v) for v in await self._script("host_view", self._host_view, [self.host_key(host)], [])
        )
        return HostView(
            ready_in=max(0, max(next_allowed, until) - now) / US,
            backoff_in=max(0, until - now) / US,
            throttles=throttles,
            crawl_delay=crawl_delay / US,
            robots_fresh=robots > now,
        )

    async def grants(self) -> int:
        count = await self._call("grants", lambda: self.client.hget(self.global_key, "count"))
        return int(count or 0)

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except (RedisError, OSError):
            pass
