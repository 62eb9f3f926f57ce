"""``politeproxy cache stats|clear [--index]``: what the shared cache holds, its index part (the index
server's kept answers, issue 43) apart, and emptying it or that part alone (safe while proxies run: a
reader with an open entry finishes its answer, and the index is changed in one transaction)."""

from __future__ import annotations

from pathlib import Path

from politeproxy.cache.redis_answers import CLEAR
from politeproxy.cache.store import INDEX_KIND, DiskStore
from politeproxy.policy.cacherules import CacheLimits


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def run(action: str, root: Path, limits: CacheLimits, index: bool = False) -> str:
    """The lines to print for ``action`` ("stats" or "clear") on the cache in ``root``; ``index``: the
    index server's kept answers only."""
    store = DiskStore(root, limits)
    try:
        if action == "clear":
            n = store.clear(INDEX_KIND if index else None)
            return f"cache: {root}\ncleared: {n} {'index answers' if index else 'entries'}"
        entries, nbytes = store.totals()
        share = 100.0 * nbytes / limits.max_size if limits.max_size else 0.0
        state = "on" if limits.enabled else "off (cache.enabled = false)"
        kept, kept_bytes = store.totals(INDEX_KIND)
        answers = "on" if limits.index_answers else "off (cache.index_answers = false)"
        return (
            f"cache: {root} ({state})\nentries: {entries}\n"
            f"bytes: {nbytes} ({_mib(nbytes)}, {share:.1f}% of cache.max_size {_mib(limits.max_size)})\n"
            f"index answers ({answers}): {kept} entries, {kept_bytes} bytes ({_mib(kept_bytes)})"
        )
    finally:
        store.close()


def redis_part(action: str, url: str, prefix: str) -> str:
    """On the redis store: the kept index answers in Redis (issue 43), counted or cleared; one line."""
    import redis  # only with the redis store

    client = redis.Redis.from_url(url, socket_timeout=3.0, socket_connect_timeout=3.0)
    p = f"{prefix}ix:"
    try:
        if action == "clear":
            n = client.register_script(CLEAR)(keys=[f"{p}order", f"{p}sizes"], args=[f"{p}a:"])
            return f"cleared in Redis: {int(n)} index answers"
        n, total = client.zcard(f"{p}order"), client.hget(f"{p}sizes", "#total")
        return f"index answers in Redis: {int(n)} entries, {int(total or 0)} bytes"
    except redis.RedisError as e:
        return f"index answers in Redis: not reachable ({type(e).__name__})"
    finally:
        client.close()
