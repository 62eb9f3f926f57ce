"""What the cache reports (a small family of events that metrics hears) and what an entry holds."""

from __future__ import annotations

from dataclasses import dataclass

RESULTS = ("hit", "miss", "bypass", "stale")
# issue 43: how an index (CDX) question of a published crawl was answered: from a kept answer, from another
# asker's question in flight (here or on another proxy sharing the cache), or by asking the index server
INDEX_RESULTS = ("kept", "shared", "asked")


class CacheEvents:
    """What the cache reports, each event declared once, here: a method that does nothing (so this class
    is also the sink that hears nothing). ``result`` is one of RESULTS (``index_question``:
    INDEX_RESULTS); ``pipeline`` the (bounded) name the request counted as. Sinks subclass it and
    override what they hear (``observe/fanout.py`` joins them)."""

    def cache_result(self, result: str, pipeline: str) -> None:
        """A request to a cacheable host, by cache result."""

    def index_question(self, result: str, pipeline: str) -> None:
        """A CDX question about a published crawl, by how it was answered."""

    def cache_slot_saved(self, pipeline: str) -> None:
        """An answer from the cache that would have taken a slot or an exempt place."""

    def cache_size(self, nbytes: int) -> None:
        """The bytes in the shared disk cache now."""

    def cache_evicted(self, n: int) -> None:
        """Entries evicted to stay under cache.max_size."""


NoCacheEvents = CacheEvents  # the family's own no-op methods: the sink that hears nothing


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
