"""What the cache reports (a small Protocol that metrics implements) and what an entry holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

RESULTS = ("hit", "miss", "bypass", "stale")
# issue 43: how an index (CDX) question of a published crawl was answered: from a kept answer, from another
# asker's question in flight (here or on another proxy sharing the cache), or by asking the index server
INDEX_RESULTS = ("kept", "shared", "asked")


class CacheEvents(Protocol):
    """``result`` is one of RESULTS (``index_question``: INDEX_RESULTS); ``pipeline`` the (bounded) name the
    request counted as."""

    def cache_result(self, result: str, pipeline: str) -> None: ...
    def index_question(self, result: str, pipeline: str) -> None: ...
    def cache_slot_saved(self, pipeline: str) -> None: ...
    def cache_size(self, nbytes: int) -> None: ...
    def cache_evicted(self, n: int) -> None: ...


class NoCacheEvents:
    def cache_result(self, result: str, pipeline: str) -> None:
        pass

    def index_question(self, result: str, pipeline: str) -> None:
        pass

    def cache_slot_saved(self, pipeline: str) -> None:
        pass

    def cache_size(self, nbytes: int) -> None:
        pass

    def cache_evicted(self, n: int) -> None:
        pass


@dataclass(frozen=True)
class Meta:
    """An entry's head, stored after its body: the answer's status and headers, the body's length and
    CRC-32, and when it was stored (wall clock seconds, for Age and a TTL)."""

    key: str
    status: int
    headers: tuple[tuple[str, str], ...]
    length: int
    crc: int
    stored: float


class CacheError(Exception):
    """The cache directory cannot be used (one line for the user)."""
