"""Kept index answers in Redis (issue 43): proxies with data dirs of their own share them, and one asks.

With ``schedule.backend = "redis"`` the index server's kept answers (the CDX answers of published crawls)
also live in the store, so a proxy on another machine answers a question another proxy asked. Each answer
is one hash (``{prefix}ix:a:<sha256 of the key>``: its head as JSON and its body), bounded by
``cache.index_redis_max_answer``; their total by ``cache.index_redis_max_size``, the oldest out first (a
sorted set of names by the time stored, and a hash of sizes with their ``#total``, changed in one script).
The head is checked on read as a disk entry's is (it names the key; a body of its length); anything else
is a miss. A question in flight holds a lease (``{prefix}ix:lease:<name>``, SET NX with a TTL, refreshed
while it runs), so identical questions from proxies sharing Redis reach the index server once.

Every call is bounded (CALL_TIMEOUT) and never raises to a request: Redis down is a miss, never an error,
and after a failure Redis is left alone for DOWN_FOR seconds, so questions do not each wait for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from politeproxy.cache.store import key_name
from politeproxy.policy.cacherules import STORED_HEADERS

log = logging.getLogger("politeproxy")
CALL_TIMEOUT = 3.0  # seconds a Redis call may take before it counts as a miss (the request goes on)
DOWN_FOR = 10.0  # seconds after a failed call during which Redis is not asked (no question waits on it)
LEASE_TTL_MS = 10_000  # a lease not refreshed for this long belongs to a dead or stuck proxy
MAX_HEAD = 64 * 1024
_DOWN = object()  # a call that failed (distinct from Redis's own None)

# KEYS: the answer, the order (zset), the sizes (hash with "#total"). ARGV: name, head, body, stored time,
# max total, the answers' key prefix. Oldest out first until the total fits (never the answer just put).
PUT = """
local name, size = ARGV[1], string.len(ARGV[2]) + string.len(ARGV[3])
local old = tonumber(redis.call('HGET', KEYS[3], name)) or 0
redis.call('HSET', KEYS[1], 'head', ARGV[2], 'body', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], name)
redis.call('HSET', KEYS[3], name, size)
local total = redis.call('HINCRBY', KEYS[3], '#total', size - old)
local evicted = 0
while total > tonumber(ARGV[5]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest or oldest == name then break end
  local s = tonumber(redis.call('HGET', KEYS[3], oldest)) or 0
  redis.call('ZREM', KEYS[2], oldest)
  redis.call('HDEL', KEYS[3], oldest)
  redis.call('DEL', ARGV[6] .. oldest)
  total = redis.call('HINCRBY', KEYS[3], '#total', -s)
  evicted = evicted + 1
end
return evicted
"""
# KEYS: the order, the sizes. ARGV: the answers' key prefix. Every kept answer goes (cache clear --index).
CLEAR = """
local names = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, n in ipairs(names) do redis.call('DEL', ARGV[1] .. n) end
redis.call('DEL', KEYS[1], KEYS[2])
return #names
"""


@dataclass(frozen=True)
class Kept:
    """One answer read back: status, the stored headers, the body, when it was stored (wall clock)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    stored: float


def parse_kept(key: str, head: object, body: object) -> Kept | None:
    """An answer from Redis's bytes, or None: the head must be JSON naming ``key`` with a sane status,
    headers and time, and the body exactly its length (records are untrusted: never raises)."""
    if not isinstance(head, bytes) or not isinstance(body, bytes) or len(head) > MAX_HEAD:
        return None
    try:
        raw = json.loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(raw, dict) or raw.get("key") != key:
        return None
    status, stored, length, headers = (
        raw.get("status"),
        raw.get("stored"),
        raw.get("length"),
        raw.get("headers"),
    )
    if status not in (200, 404) or not isinstance(length, int) or length != len(body):
        return None
    if not isinstance(stored, int | float) or isinstance(stored, bool) or not math.isfinite(stored):
        return None
    if not isinstance(headers, list) or len(headers) > 16:
        return None
    out: list[tuple[str, str]] = []
    for h in headers:
        if not (isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)):
            return None
        if h[0] in STORED_HEADERS and len(h[1]) <= 8192 and h[1].isprintable():
            out.append((h[0], h[1]))
    return Kept(status, out, body, float(stored))


class RedisAnswers:
    """The kept index answers on one Redis server and prefix (the schedule's own client)."""

    def __init__(self, client: Any, prefix: str, max_answer: int, max_size: int) -> None:
        self.client = client
        self.prefix = f"{prefix}ix:"
        self.max_answer, self.max_size = max_answer, max_size
        self.holder = f"{os.getpid()} {socket.gethostname()[:64]}"
        self._put = client.register_script(PUT)
        self._clear = client.register_script(CLEAR)
        self._warned = False
        self._down_until = 0.0  # monotonic: Redis is not asked before then

    def _answer(self, name: str) -> str:
        return f"{self.prefix}a:{name}"

    def _lease(self, name: str) -> str:
        return f"{self.prefix}lease:{name}"

    async def _call(self, what: str, coro: Any, default: Any) -> Any:
        if time.monotonic() < self._down_until:
            getattr(coro, "close", lambda: None)()  # never awaited: Redis failed a moment ago
            return default
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                return await coro
        except Exception as e:  # noqa: BLE001 - Redis down: the question goes on without it
            self._down_until = time.monotonic() + DOWN_FOR
            if not self._warned:
                self._warned = True
                log.warning("kept index answers in Redis: %s failed (%s); going on without them", what, e)
            return default

    async def has(self, key: str) -> bool:
        """Whether an answer is kept for ``key`` (its body not read: a waiter looks often)."""
        return bool(await self._call("a look", self.client.exists(self._answer(key_name(key))), 0))

    async def get(self, key: str) -> Kept | None:
        head, body = await self._call(
            "a read", self.client.hmget(self._answer(key_name(key)), ["head", "body"]), (None, None)
        )
        return parse_kept(key, head, body)

    async def put(
        self, key: str, status: int, headers: list[tuple[str, str]], body: bytes, stored: float
    ) -> int:
        """Keep an answer (not one over max_answer); how many older answers went to make room."""
        if len(body) > self.max_answer or len(body) > self.max_size:
            return 0
        name = key_name(key)
        head = json.dumps(
            {"key": key, "status": status, "headers": headers, "length": len(body), "stored": stored},
            separators=(",", ":"),
        ).encode()
        keys = [self._answer(name), f"{self.prefix}order", f"{self.prefix}sizes"]
        args = [name, head, body, repr(stored), self.max_size, f"{self.prefix}a:"]
        return int(await self._call("a write", self._put(keys=keys, args=args), 0))

    async def take_lease(self, key: str) -> bool | None:
        """True: this proxy asks; False: another proxy's question is in flight; None: Redis is down."""
        got = await self._call(
            "a lease",
            self.client.set(self._lease(key_name(key)), self.holder, nx=True, px=LEASE_TTL_MS),
            _DOWN,
        )
        return None if got is _DOWN else bool(got)

    async def refresh_lease(self, key: str) -> None:
        await self._call(
            "a lease refresh", self.client.pexpire(self._lease(key_name(key)), LEASE_TTL_MS), None
        )

    async def drop_lease(self, key: str) -> None:
        await self._call("a lease drop", self.client.delete(self._lease(key_name(key))), None)

    async def clear(self) -> int:
        """Remove every kept index answer; how many."""
        keys = [f"{self.prefix}order", f"{self.prefix}sizes"]
        return int(await self._call("a clear", self._clear(keys=keys, args=[f"{self.prefix}a:"]), 0))

    async def totals(self) -> tuple[int, int]:
        n = await self._call("a count", self.client.zcard(f"{self.prefix}order"), 0)
        total = await self._call("a count", self.client.hget(f"{self.prefix}sizes", "#total"), 0)
        return int(n or 0), int(total or 0)
