"""The disk store (politeproxy/cache): entry files, the SQLite index, eviction, locks. Blocking calls on a
temporary directory; no proxy process."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.cache.entry import MAGIC, TRAILER, Corrupt, open_entry
from politeproxy.cache.store import LEASE_STALE, DiskStore, Found, key_name
from politeproxy.policy.cacherules import STORED_HEADERS, CacheLimits

HEADERS = [("Content-Type", "application/octet-stream"), ("Content-Length", "1000")]


def put(s: DiskStore, key: str, body: bytes, status: int = 200) -> list[str]:
    w = s.writer(key)
    for i in range(0, len(body), 300):
        w.write(body[i : i + 300])
    return s.commit(w, key, status, [("Content-Length", str(len(body)))], len(body))


def read(found: Found | str) -> bytes:
    assert isinstance(found, Found), found
    try:
        return found.f.read()[: found.meta.length]
    finally:
        found.f.close()


@pytest.fixture
def store(tmp_path: Path) -> DiskStore:
    return DiskStore(tmp_path / "cache", CacheLimits(max_size=10_000))


def test_round_trip_and_names_are_hashes(store: DiskStore) -> None:
    key = "GET data /crawl-data/../../etc/passwd *"
    put(store, key, b"a" * 1000)
    assert read(store.lookup(key)) == b"a" * 1000
    files = [p for p in (store.root / "objects").rglob("*") if p.is_file()]
    assert [p.name for p in files] == [key_name(key)]
    assert store.lookup("GET data /other *") == "absent"
    assert store.totals()[0] == 1


def test_a_short_or_long_body_is_never_committed(store: DiskStore) -> None:
    w = store.writer("k")
    w.write(b"x" * 10)
    with pytest.raises(Corrupt):
        store.commit(w, "k", 200, HEADERS, 11)
    assert store.lookup("k") == "absent"
    assert not list((store.root / "tmp").iterdir())  # the temp file went too


@pytest.mark.parametrize("damage", ["flip", "truncate", "append", "trailer"])
def test_a_corrupt_entry_is_dropped(store: DiskStore, damage: str) -> None:
    put(store, "k", os.urandom(2000))
    path = store.path_for(key_name("k"))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[100] ^= 0xFF  # same length: only the CRC-32 sees it
    elif damage == "truncate":
        data = data[:1500]
    elif damage == "append":
        data += b"zz"
    else:
        data[-1:] = b"X"
    path.write_bytes(bytes(data))
    assert store.lookup("k") == "corrupt"
    assert not path.exists() and store.totals() == (0, 0)


def test_an_entry_under_another_keys_name_is_not_served(store: DiskStore) -> None:
    put(store, "a", b"1" * 10)
    os.replace(store.path_for(key_name("a")), store.path_for(key_name("a")).with_name(key_name("b")))
    with pytest.raises(Corrupt):
        open_entry(store.path_for(key_name("a")).with_name(key_name("b")), "b")


def test_eviction_is_lru_and_keeps_the_total_under_max_size(tmp_path: Path) -> None:
    t = [1000.0]
    s = DiskStore(tmp_path / "c", CacheLimits(max_size=5000), clock=lambda: t[0])
    for i in range(4):
        t[0] += 1
        put(s, f"k{i}", bytes([i]) * 1000)
    t[0] += 1
    read(s.lookup("k0"))  # k0 is now the most recently used; k1 the least
    t[0] += 1
    evicted = put(s, "k4", b"4" * 1000)
    assert evicted == [key_name("k1")]
    assert s.lookup("k1") == "absent"
    for k in ("k0", "k2", "k3", "k4"):
        read(s.lookup(k))
    n, total = s.totals()
    on_disk = sum(p.stat().st_size for p in (s.root / "objects").rglob("*") if p.is_file())
    assert total == on_disk <= 5000 and n == 4


def test_two_stores_on_one_directory_share_entries_and_the_cap(tmp_path: Path) -> None:
    a = DiskStore(tmp_path / "c", CacheLimits(max_size=3000))
    b = DiskStore(tmp_path / "c", CacheLimits(max_size=3000))
    put(a, "x", b"x" * 1000)
    assert read(b.lookup("x")) == b"x" * 1000
    for i in range(5):
        put(b if i % 2 else a, f"y{i}", b"y" * 1000)
    assert a.totals()[1] <= 3000
    on_disk = sum(p.stat().st_size for p in (tmp_path / "c" / "objects").rglob("*") if p.is_file())
    assert on_disk <= 3000


def test_an_object_larger_than_the_cache_is_not_kept(tmp_path: Path) -> None:
    s = DiskStore(tmp_path / "c", CacheLimits(max_size=500))
    assert put(s, "big", b"b" * 1000) == []
    assert s.lookup("big") == "absent"


def test_sweep_removes_dead_writers_temp_files_and_orphans(store: DiskStore) -> None:
    dead = store.tmp / "999999999-abc-00.part"
    dead.write_bytes(b"half")
    put(store, "k", b"k" * 100)
    orphan = store.path_for("ab" + "0" * 62)
    orphan.parent.mkdir(exist_ok=True)
    orphan.write_bytes(b"old")
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    assert store.sweep() == 2
    assert not dead.exists() and not orphan.exists()
    assert read(store.lookup("k")) == b"k" * 100


def test_a_lease_is_exclusive_per_key_and_a_stale_one_is_taken_over(store: DiskStore) -> None:
    assert store.take_lease("k") is True
    assert store.take_lease("k") is False and store.lease_held("k")  # held: another fetch of k waits
    assert store.take_lease("other") is True  # another key never waits on it
    old = time.time() - LEASE_STALE - 5
    os.utime(store.lease_path("k"), (old, old))  # its holder died without refreshing it
    assert not store.lease_held("k")
    assert store.take_lease("k") is True
    store.refresh_lease("k")
    assert store.lease_held("k")
    store.drop_lease("k")
    store.drop_lease("other")
    assert not store.lease_held("k") and list(store.locks.iterdir()) == []


def test_a_lease_left_by_a_dead_process_of_this_host_is_taken_over_at_once(store: DiskStore) -> None:
    assert store.take_lease("k") is True
    text = store.lease_path("k").read_text()
    store.lease_path("k").write_text(text.replace(str(os.getpid()), "999999999", 1))  # kill -9'd holder
    assert store.take_lease("k") is True
    store.drop_lease("k")


def test_clear(store: DiskStore) -> None:
    put(store, "a", b"a" * 10)
    put(store, "b", b"b" * 10)
    assert store.clear() == 2
    assert store.lookup("a") == "absent" and store.totals() == (0, 0)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> DiskStore:
    return DiskStore(tmp_path_factory.mktemp("c"), CacheLimits())


def _lookup_never_raises(s: DiskStore, data: bytes) -> None:
    path = s.path_for(key_name("k"))
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    got = s.lookup("k")
    if isinstance(got, Found):
        got.f.close()
        assert {h for h, _v in got.meta.headers} <= set(STORED_HEADERS)
    else:
        assert got == "corrupt" and not path.exists()


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4096))
def test_any_bytes_in_an_entry_file_are_corrupt_never_an_error(shared: DiskStore, data: bytes) -> None:
    """Whatever bytes sit at an entry's path (a damaged disk, another program), lookup answers "corrupt"
    (and drops the file) or serves a verified entry; it never raises."""
    _lookup_never_raises(shared, data)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=50, deadline=None)
@given(
    st.binary(max_size=64),
    st.fixed_dictionaries(
        {},
        optional={
            "key": st.sampled_from(["k", "other"]) | _JSON,
            "status": st.sampled_from([200, 206, 500]) | _JSON,
            "headers": st.lists(st.lists(st.text(max_size=20), min_size=2, max_size=2), max_size=3) | _JSON,
            "length": st.integers(-5, 100) | _JSON,
            "crc": st.integers(-5, 2**33) | _JSON,
            "stored": st.floats() | _JSON,
        },
    ),
)
def test_any_head_behind_a_valid_trailer_is_corrupt_or_verified(
    shared: DiskStore, body: bytes, head: dict
) -> None:
    """An entry whose trailer is well formed but whose JSON head holds anything (wrong types, NaN, huge
    ints, unknown header names, control characters) is dropped as corrupt or served verified; never an
    exception, never a header outside the stored set."""
    import json

    raw = json.dumps(head).encode()
    _lookup_never_raises(shared, body + raw + TRAILER.pack(len(raw), MAGIC))


def test_a_head_whose_content_length_is_not_its_body_is_corrupt(store: DiskStore) -> None:
    """The stored Content-Length goes out with a hit: one that disagrees with the body would make a short
    (or long) answer, so such an entry is never served."""
    w = store.writer("GET x")
    w.write(b"abc")
    store.commit(w, "GET x", 200, [("Content-Length", "4")], 3)
    assert store.lookup("GET x") == "corrupt"
    w = store.writer("GET y")
    w.write(b"abc")
    store.commit(w, "GET y", 200, [("Content-Length", "3")], 3)
    assert read(store.lookup("GET y")) == b"abc"


def test_a_206_whose_content_range_disagrees_is_corrupt(store: DiskStore) -> None:
    for cr, ok in (("bytes 0-2/10", True), ("bytes 0-3/10", False), (None, False)):
        key = f"GET r {cr}"
        w = store.writer(key)
        w.write(b"abc")
        headers = [("Content-Length", "3")] + ([("Content-Range", cr)] if cr else [])
        store.commit(w, key, 206, headers, 3)
        got = store.lookup(key)
        assert (read(got) == b"abc") if ok else got == "corrupt"
