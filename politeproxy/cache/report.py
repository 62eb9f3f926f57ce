"""``politeproxy cache stats|clear [--index]``: what the shared cache holds, its index part (the index
server's kept answers, issue 43) apart, and emptying it or that part alone (safe while proxies run: a
reader with an open entry finishes its answer, and the index is changed in one transaction)."""

from __future__ import annotations

from pathlib import Path

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
