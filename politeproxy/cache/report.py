"""``politeproxy cache stats|clear``: what the shared cache holds, and emptying it (safe while proxies run:
a reader with an open entry finishes its answer, and the index is changed in one transaction)."""

from __future__ import annotations

from pathlib import Path

from politeproxy.cache.store import DiskStore
from politeproxy.policy.cacherules import CacheLimits


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def run(action: str, root: Path, limits: CacheLimits) -> str:
    """The lines to print for ``action`` ("stats" or "clear") on the cache in ``root``."""
    store = DiskStore(root, limits)
    try:
        if action == "clear":
            n = store.clear()
            return f"cache: {root}\ncleared: {n} entries"
        entries, nbytes = store.totals()
        share = 100.0 * nbytes / limits.max_size if limits.max_size else 0.0
        state = "on" if limits.enabled else "off (cache.enabled = false)"
        return (
            f"cache: {root} ({state})\nentries: {entries}\n"
            f"bytes: {nbytes} ({_mib(nbytes)}, {share:.1f}% of cache.max_size {_mib(limits.max_size)})"
        )
    finally:
        store.close()
