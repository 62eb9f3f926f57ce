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

from politeproxy.policy.backoff import BackoffPolicy, Delay, Kind
from politeproxy.policy.fairclaim import FairAsk
from politeproxy.policy.slots import MAX_BACKOFF, MAX_CRAWL_DELAY, MAX_ROBOTS_TTL, Claim, Outcome, duration
from politeproxy.policy.window import MAX_COUNT, MAX_KEPT, Relative, WindowRule
from politeproxy.stores import redis_lua, redis_view_lua
from politeproxy.stores.base import FailoverSide, HostView, StoreError, WarnOnce, jitter_source

T = TypeVar("T")
US = 1_000_000

_OUTCOMES = {0: Outcome.GRANTED, 1: Outcome.HOST_NOT_READY, 2: Outcome.TOO_LATE, 3: Outcome.NOT_YOUR_TURN}


def _us(seconds: float) -> int:
    """Seconds to whole microseconds; a positive value never rounds down to 0 (0 means "off")."""
    if seconds <= 0:
        return 0
    return max(1, round(seconds * US))


def _window_args(rule: WindowRule | None) -> list[int]:
    """The scripts' window_us and window_limit (0: no window)."""
    if rule is None or not rule.on:
        return [0, 0]
    return [_us(duration(rule.seconds)), max(0, int(rule.limit))]


def _fair_args(fair: FairAsk | None, gap_us: int) -> list[int | str]:
    """The claim script's fair ask: proxy, pipeline, weight, backlog names (none: no fair turn)."""
    if fair is None or gap_us <= 0:
        return []
    return [fair.proxy or "-", fair.pipeline, repr(fair.w()), *fair.marks()[1:]]


def _claim(code: int, wait: float, rest: Sequence[Any]) -> Claim:
    """A claim from a script's answer: its optional tail is the probe flag, the window flag, whose turn."""
    probe = bool(rest and int(rest[0]))
    full = bool(len(rest) > 1 and int(rest[1]))
    turn = rest[2] if len(rest) > 2 else b""
    name = turn.decode("utf-8", "replace") if isinstance(turn, bytes) else str(turn)
    return Claim(_OUTCOMES.get(code, Outcome.HOST_NOT_READY), wait, time.time() + wait, probe, full, name)


class RedisStore(FailoverSide):
    """The schedule in Redis, shared by every proxy on every machine pointed at one server and prefix:
    each decision one Lua script on the server's clock (see the module's text for the keys)."""

    name = "redis"

    def __init__(
        self,
        url: str,
        prefix: str = "politeproxy:",
        key_ttl: float = 86400.0,
        rand: Callable[[], float] = jitter_source,
        socket_timeout: float = 1.0,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.key_ttl_ms = max(1, round(key_ttl * 1000))
        self.rand = rand
        self.max_backoff = duration(max_backoff, MAX_BACKOFF)
        self.warn = WarnOnce()
        self._last_next_us = 0  # the global next this proxy's last grant wrote (server clock)
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
        self._claim = self.client.register_script(redis_lua.CLAIM)
        self._throttle = self.client.register_script(redis_lua.THROTTLE)
        self._exempt = self.client.register_script(redis_lua.EXEMPT)
        self._hold = self.client.register_script(redis_lua.HOLD)
        self._succeeded = self.client.register_script(redis_lua.SUCCEEDED)
        self._set_crawl_delay = self.client.register_script(redis_view_lua.SET_CRAWL_DELAY)
        self._host_view = self.client.register_script(redis_view_lua.HOST_VIEW)
        self._window_used = self.client.register_script(redis_view_lua.WINDOW_USED)
        self._release = self.client.register_script(redis_view_lua.RELEASE)
        self._add_window = self.client.register_script(redis_view_lua.ADD_WINDOW)

    @property
    def global_key(self) -> str:
        return f"{self.prefix}global"

    @property
    def fair_key(self) -> str:
        """The pipelines' fair turns (stores/redis_fair_lua.py): one per store, as the global slot."""
        return f"{self.prefix}fair"

    def host_key(self, host: str) -> str:
        return f"{self.prefix}host:{host}"

    def window_key(self, rule: WindowRule | None) -> str:
        """One window per egress and service: every proxy with the same ``[egress] name`` shares it."""
        if rule is None:
            return f"{self.prefix}window:-"
        return f"{self.prefix}window:{rule.egress}:{rule.service}"

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

    def _corrupt(self, flags: int, host: str) -> None:
        if flags & 1:
            msg = "redis store: the global next slot is beyond a minute and a few gaps ahead; treated as now"
            self.warn("global", msg)
        if flags & 2:
            msg = "redis store: the record of %s holds times no legitimate wait gives; treated as now"
            self.warn("host", msg, host)
        if flags & 4:
            msg = "redis store: the request window of %s's service holds counts no use gives; bounded"
            self.warn("window", msg, host)
        if flags & 8:
            self.warn("fair", "redis store: the fair-queuing record holds values no use gives; bounded")

    async def claim_with_server_time(
        self,
        host: str,
        gap: float,
        interval: float,
        max_wait: float | None,
        not_before: float = 0.0,
        window: WindowRule | None = None,
        fair: FairAsk | None = None,
    ) -> tuple[Claim, float]:
        """Like :meth:`claim`, plus the slot in the server's clock (exact; for tests and diagnostics)."""
        wait_arg = "" if max_wait is None else round(duration(max_wait) * US)
        gap_us = _us(duration(gap))
        args = [gap_us, _us(duration(interval)), wait_arg, self.key_ttl_ms, _us(self.max_backoff)]
        args += [_us(duration(not_before)), self._last_next_us, *_window_args(window)]
        args += _fair_args(fair, gap_us)
        keys = [self.global_key, self.host_key(host), self.window_key(window), self.fair_key]
        code, wait_us, at_us, corrupt, *rest = await self._script("claim", self._claim, keys, args)
        self._corrupt(int(corrupt), host)
        if int(code) == 0 and gap_us > 0:
            self._last_next_us = int(at_us) + gap_us
        wait = int(wait_us) / US
        # The slot is in the server's clock; ``at`` is re-based on the local one so local code can use it.
        c = _claim(int(code), wait, rest)
        self.note_probe(host, c)
        return c, int(at_us) / US

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
        c, _ = await self.claim_with_server_time(host, gap, interval, max_wait, not_before, window, fair)
        return c

    async def window_used(self, rule: WindowRule) -> int:
        if not rule.on:
            return 0
        keys, args = [self.window_key(rule)], [_us(duration(rule.seconds))]
        return int(await self._script("window_used", self._window_used, keys, args))

    async def window_counts(self, rule: WindowRule) -> Relative:
        """The window's hash read with the server's TIME in one transaction, as relative counts."""
        if not rule.on:
            return ()

        async def read() -> list[Any]:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.time()
                pipe.hgetall(self.window_key(rule))
                return list(await pipe.execute())

        (secs, usecs), raw = await self._call("window_counts", read)
        return hash_counts(raw, int(secs) * US + int(usecs), rule)

    async def add_window(self, rule: WindowRule, counts: Relative) -> None:
        if not rule.on or not counts:
            return
        args: list[int | str] = [_us(duration(rule.seconds))]
        for rel, c in counts[-MAX_KEPT:]:
            args += [round(rel * US), c]
        await self._script("add_window", self._add_window, [self.window_key(rule)], args)

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
        wait_arg = "" if max_wait is None else round(duration(max_wait) * US)
        args = [_us(duration(rate)), max(1, int(burst)), wait_arg, self.key_ttl_ms, _us(self.max_backoff)]
        args += ["1" if hold else "0", *_window_args(window)]
        keys = [self.host_key(host), self.host_key(ceiling or host), self.window_key(window)]
        code, wait_us, corrupt, *rest = await self._script("exempt_claim", self._exempt, keys, args)
        self._corrupt(int(corrupt), host)
        wait = int(wait_us) / US
        c = _claim(int(code), wait, rest)
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
        # One script: counting the throttle and applying its backoff cannot be separated by a cancellation
        # or a crash. The arithmetic is backoff.answer_delay's, in Lua;
        # tests/unit/stores/test_claim_cases.py checks.
        self.probe_answered(host)
        ra = None if retry_after is None else duration(retry_after)
        args: list[int | str] = [
            "" if ra is None else repr(ra),
            repr(policy.base),
            repr(policy.factor),
            repr(policy.cap),
            repr(policy.jitter),
            repr(self.rand()),
            self.key_ttl_ms,
            _us(self.max_backoff),
            int(kind),
            _us(duration(base)),
            repr(policy.block_hold),
            repr(policy.block_hold_cap),
            "1" if policy.adaptive else "0",
            repr(policy.adaptive_floor),
            repr(policy.adaptive_recovery),
        ]
        key = [self.host_key(host)]
        delay_us, corrupt, block = await self._script("throttled", self._throttle, key, args)
        self._corrupt(int(corrupt), host)
        top = max(policy.cap, policy.block_hold_cap) if int(block) else policy.cap
        capped = ra if ra is not None and ra > top else None
        return Delay(int(delay_us) / US, capped_from=capped, block=bool(int(block)))

    async def mirror_backoff(self, host: str, seconds: float) -> None:
        args = [_us(duration(seconds, self.max_backoff)), self.key_ttl_ms, _us(self.max_backoff)]
        await self._script("mirror_backoff", self._hold, [self.host_key(host)], args)

    async def succeeded(self, host: str) -> None:
        self.probe_answered(host)
        await self._script("succeeded", self._succeeded, [self.host_key(host)], [])

    async def release(self, host: str) -> None:
        self.probe_answered(host)
        await self._script("release", self._release, [self.host_key(host)], [])

    async def set_crawl_delay(self, host: str, delay: float, ttl: float) -> None:
        args = [
            _us(duration(delay, MAX_CRAWL_DELAY)),
            round(duration(ttl, MAX_ROBOTS_TTL) * US),
            self.key_ttl_ms,
        ]
        await self._script("set_crawl_delay", self._set_crawl_delay, [self.host_key(host)], args)

    async def host_view(self, host: str) -> HostView:
        raw = await self._script("host_view", self._host_view, [self.host_key(host)], [_us(self.max_backoff)])
        now, next_allowed, until, throttles, crawl_delay, robots, blocks = (int(v) for v in raw[:7])
        probe, ai, afrom, auntil, _tat, corrupt = (int(v) for v in raw[8:])
        self._corrupt(corrupt, host)
        return HostView(
            ready_in=max(0, max(next_allowed, until) - now) / US,
            backoff_in=max(0, until - now) / US,
            throttles=throttles,
            crawl_delay=crawl_delay / US,
            robots_fresh=robots > now,
            blocks=blocks,
            probe_in=max(0, probe - now) / US,
            adapt_interval=ai / US,
            adapt_from_in=(afrom - now) / US,
            adapt_until_in=(auntil - now) / US,
        )

    async def grants(self) -> int:
        count = await self._call("grants", lambda: self.client.hget(self.global_key, "count"))
        return int(count or 0)

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except (RedisError, OSError):
            pass


def hash_counts(raw: dict[Any, Any], now_us: int, rule: WindowRule) -> Relative:
    """A window hash (``w`` = the bucket width in us, ``<bucket>`` = count; stores/redis_window_lua.py) as
    ``policy.window.relative`` counts at the server's ``now_us``: the buckets that still count. Untrusted
    (any program may write the key): what is not a number is skipped, counts are bounded."""

    def integer(v: Any) -> int | None:
        try:
            return int(v.decode() if isinstance(v, bytes) else v)
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
            return None

    w = integer(raw.get(b"w", raw.get("w")))
    if w is None or w <= 0:
        return ()
    reach = rule.reach
    out: list[tuple[float, int]] = []
    for k, v in raw.items():
        i, c = integer(k), integer(v)
        if k in (b"w", "w") or i is None or c is None or c <= 0:
            continue
        rel = ((i + 1) * w - now_us) / US
        if rel > -reach:
            out.append((rel, min(c, MAX_COUNT)))
    return tuple(sorted(out)[-MAX_KEPT:])
