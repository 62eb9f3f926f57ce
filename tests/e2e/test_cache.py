"""The shared disk cache against the fake upstream, counted from its arrival log (issue 14).

One fake upstream and two proxies on one data dir for the module. The rules are overridden to add
/files/ (the fake upstream's file route with Range support) to the data class, so a "WARC record" range
is a paced 206 like the real one under /crawl-data/.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from politeproxy.cache.store import key_name
from politeproxy.policy.cacherules import cache_key
from tests.support.cache_upstream import CACHE_TOML, D, fetch
from tests.support.processes import wait_for
from tests.support.proxy_proc import ProxyProc, start_proxy
from tests.support.proxyio import upstream_toml
from tests.support.upstream_proc import Certs, Upstream, start_upstream

RULES = """
[[cache.rules]]
class = "data"
hosts = ["data.commoncrawl.org", "commoncrawl.s3.amazonaws.com"]
paths = ["/crawl-data/", "/cc-index/", "/files/"]
[[cache.rules]]
class = "index"
hosts = ["index.commoncrawl.org"]
paths = ["/collinfo.json"]
exact = true
ttl = "24h"
"""


class Env:
    def __init__(self, up: Upstream, a: ProxyProc, files: Path, text: str) -> None:
        self.up, self.a, self.files, self.text = up, a, files, text
        self.b: ProxyProc | None = None

    def second(self) -> ProxyProc:
        """Another proxy on the same data dir (started by the first test that needs it)."""
        if self.b is None:
            self.b = start_proxy(self.a.data_dir.parent, None, None, self.text, data_dir=self.a.data_dir)
        return self.b

    def count(self, path: str, method: str = "GET") -> int:
        return sum(1 for x in self.up.log() if x["path"] == path and x["method"] == method)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cache")
    files = tmp / "files"
    files.mkdir()
    up = start_upstream(certs, tmp, files_dir=files)
    text = CACHE_TOML + "[cache]\n" + RULES + upstream_toml(up, certs)
    env = Env(up, start_proxy(tmp, None, None, text, data_dir=tmp / "data"), files, text)
    yield env
    for p in (env.a, env.b):
        if p is not None:
            p.stop()
    up.stop()


def metric(p: ProxyProc, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in p.metrics().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_hit_is_the_stored_answer_with_age_and_via_and_takes_no_slot(env: Env) -> None:
    path = "/crawl-data/CC-MAIN-2024-10/warc.paths.gz"
    s1, h1, b1 = fetch(env.a, D, path)
    grants = metric(env.a, "politeproxy_grants_total")
    s2, h2, b2 = fetch(env.a, D, path)
    assert (s1, s2, b1 == b2) == (200, 200, True)
    assert env.count(path) == 1
    assert metric(env.a, "politeproxy_grants_total") == grants  # no slot for the hit
    assert h2["content-type"] == h1["content-type"] and h2["content-length"] == h1["content-length"]
    assert re.fullmatch(r"\d+", h2["age"]) and "1.1 politeproxy" in h2["via"]
    assert "x-politeproxy-wait" not in h2  # it was never held
    assert metric(env.a, "politeproxy_cache_slots_saved_total") >= 1

    def lines() -> list[str]:  # the access line follows the answer's last byte
        return [x for x in env.a.log().splitlines() if "politeproxy.access" in x and path in x]

    wait_for(lambda: len(lines()) >= 2, 10, "two access lines")
    first, second = lines()[:2]
    assert "cache=miss" in first and "cache=hit" in second, (first, second)
    cache = json.loads(env.a.get("/status"))["overall"]["cache"]  # the status view's hit rate
    assert cache["hit"] >= 1 and cache["slots_saved"] >= 1 and 0 < cache["hit_rate"] <= 1, cache


def test_the_same_warc_range_from_two_pipelines_is_one_upstream_request(env: Env) -> None:
    data = bytes(range(256)) * 400
    (env.files / "CC-MAIN-1.warc.gz").write_bytes(data)
    path = "/files/CC-MAIN-1.warc.gz"
    got = [fetch(env.a, D, path, {"Range": "bytes=1000-1999"}, pipeline=who) for who in ("alice", "bob")]
    assert [(s, b) for s, _h, b in got] == [(206, data[1000:2000])] * 2
    assert got[1][1]["content-range"] == "bytes 1000-1999/102400"
    assert env.count(path) == 1
    assert metric(env.a, "politeproxy_cache_requests_total", result="hit", pipeline="bob") == 1
    # Another range of the same object is another key.
    s, _h, b = fetch(env.a, D, path, {"Range": "bytes=0-9"})
    assert (s, b, env.count(path)) == (206, data[:10], 2)


@pytest.mark.parametrize("code", [403, 503])
def test_an_error_is_never_served_from_the_cache(env: Env, code: int) -> None:
    path = f"/crawl-data/err{code}/x.warc.gz"
    env.up.control({"throttle": {"host": D, "count": 1, "status": code}})
    s1, _h, _b = fetch(env.a, D, path)
    s2, _h, b2 = fetch(env.a, D, path)
    s3, _h, b3 = fetch(env.a, D, path)
    assert (s1, s2, s3) == (code, 200, 200) and b2 == b3
    assert env.count(path) == 2  # the error, then the 200 the third answer came from


@pytest.mark.slow  # the upstream holds the answer 1 s so that all twenty overlap
def test_twenty_concurrent_identical_misses_make_one_request_with_one_slot(env: Env) -> None:
    (env.files / "sf.bin").write_bytes(b"s" * 50_000)
    path = "/cc-index/table/sf.bin"  # no Range: a paced GET; the fake upstream holds it 1 s
    env.up.control({"table_delay": 1.0})
    grants = metric(env.a, "politeproxy_grants_total")
    try:
        with ThreadPoolExecutor(20) as ex:
            got = list(ex.map(lambda _i: fetch(env.a, D, path), range(20)))
    finally:
        env.up.control({"table_delay": 0.0})
    assert all(s == 200 and b == b"s" * 50_000 for s, _h, b in got)
    assert env.count(path) == 1
    assert metric(env.a, "politeproxy_grants_total") - grants == 1


@pytest.mark.slow  # a second proxy process
def test_two_proxies_on_one_data_dir_share_hits_and_misses(env: Env) -> None:
    path = "/crawl-data/CC-MAIN-2024-10/shared.warc.gz"
    s1, _h, b1 = fetch(env.a, D, path)
    s2, _h, b2 = fetch(env.second(), D, path)
    assert (s1, s2, b1 == b2, env.count(path)) == (200, 200, True, 1)
    # Concurrent misses through both proxies: one request (the stripe lock between processes).
    (env.files / "both.bin").write_bytes(b"b" * 10_000)
    env.up.control({"table_delay": 1.0})
    try:
        with ThreadPoolExecutor(6) as ex:
            got = list(
                ex.map(lambda i: fetch((env.a, env.second())[i % 2], D, "/cc-index/table/both.bin"), range(6))
            )
    finally:
        env.up.control({"table_delay": 0.0})
    assert all(s == 200 and b == b"b" * 10_000 for s, _h, b in got)
    assert env.count("/cc-index/table/both.bin") == 1


def test_no_cache_from_the_client_refetches_and_replaces(env: Env) -> None:
    path = "/files/nc.bin"
    (env.files / "nc.bin").write_bytes(b"old")
    assert fetch(env.a, D, path)[2] == b"old"
    (env.files / "nc.bin").write_bytes(b"new")
    assert fetch(env.a, D, path)[2] == b"old"  # immutable by the rules: a hit
    assert fetch(env.a, D, path, {"Cache-Control": "no-cache"})[2] == b"new"
    name = key_name(cache_key("GET", "data", 443, path, None))
    entry = env.a.data_dir / "cache" / "objects" / name[:2] / name
    wait_for(lambda: entry.read_bytes().startswith(b"new"), 10, "the replacement renamed into place")
    assert fetch(env.a, D, path)[2] == b"new"  # replaced
    assert env.count(path) == 2


def test_a_corrupt_entry_is_dropped_and_fetched_again(env: Env) -> None:
    path = "/crawl-data/CC-MAIN-2024-10/corrupt.warc.gz"
    _s, _h, good = fetch(env.a, D, path)
    name = key_name(
        cache_key("GET", "data", 443, path, None)
    )  # the key the rules give it (tests/unit/policy/test_cacherules.py)
    newest = env.a.data_dir / "cache" / "objects" / name[:2] / name
    wait_for(newest.exists, 10, "the entry renamed into place")  # the commit follows the client's last byte
    raw = bytearray(newest.read_bytes())
    raw[3] ^= 0x20  # one bit of the body: same length, only the checksum sees it
    newest.write_bytes(bytes(raw))
    s, _h, body = fetch(env.a, D, path)
    assert (s, body, env.count(path)) == (200, good, 2)
    assert fetch(env.a, D, path)[2] == good and env.count(path) == 2


def test_head_is_cached_apart_from_get(env: Env) -> None:
    path = "/crawl-data/CC-MAIN-2024-10/head.warc.gz"
    s1, h1, b1 = fetch(env.a, D, path, method="HEAD")
    s2, h2, b2 = fetch(env.a, D, path, method="HEAD")
    assert (s1, s2, b1, b2) == (200, 200, b"", b"")
    assert h1["content-length"] == h2["content-length"] != "0"
    assert env.count(path, "HEAD") == 1
    assert fetch(env.a, D, path)[0] == 200 and env.count(path, "GET") == 1


def test_stats_and_clear_from_the_command_line(env: Env) -> None:
    from tests.support.processes import cache_command

    def cli(*args: str) -> str:
        return cache_command(*args, "--data-dir", str(env.a.data_dir))

    fetch(env.a, D, "/crawl-data/CC-MAIN-2024-10/stats.warc.gz")
    name = key_name(cache_key("GET", "data", 443, "/crawl-data/CC-MAIN-2024-10/stats.warc.gz", None))
    wait_for((env.a.data_dir / "cache" / "objects" / name[:2] / name).exists, 10, "the entry in place")
    out = cli("stats")
    assert re.search(r"entries: [1-9]", out), out
    cli("clear")
    assert re.search(r"entries: 0\b", cli("stats"))
    before = env.count("/crawl-data/CC-MAIN-2024-10/stats.warc.gz")
    fetch(env.a, D, "/crawl-data/CC-MAIN-2024-10/stats.warc.gz")
    assert env.count("/crawl-data/CC-MAIN-2024-10/stats.warc.gz") == before + 1


@pytest.mark.slow  # its own proxy with a tiny cache
def test_filling_past_max_size_evicts_the_least_recently_used(
    tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> None:
    tmp = tmp_path_factory.mktemp("evict")
    up = start_upstream(certs, tmp)
    cap = 40_000
    rules = f'[cache]\nmax_size = "{cap}"\n[[cache.rules]]\nhosts = ["{D}"]\npaths = ["/size/"]\n'
    p = start_proxy(tmp, None, None, CACHE_TOML + rules + upstream_toml(up, certs))
    try:
        paths = [f"/size/{9000 + i}" for i in range(6)]  # 9 KB bodies
        count = lambda q: sum(1 for x in up.log() if x["path"] == q)  # noqa: E731
        for q in paths[:3]:
            fetch(p, D, q)
        time.sleep(0.01)
        fetch(p, D, paths[0])  # paths[0] is now more recent than paths[1]
        for q in paths[3:]:
            fetch(p, D, q)
        # The last commit follows the client's last byte: wait for it, then look at the directory.
        wait_for(lambda: metric(p, "politeproxy_cache_evictions_total") >= 2, 10, "two evictions")
        on_disk = sum(f.stat().st_size for f in (p.data_dir / "cache" / "objects").rglob("*") if f.is_file())
        assert on_disk <= cap
        assert 0 < metric(p, "politeproxy_cache_bytes") <= cap
        fetch(p, D, paths[0])
        assert count(paths[0]) == 1  # kept: recently used
        fetch(p, D, paths[1])
        assert count(paths[1]) == 2  # evicted first: least recently used
    finally:
        p.stop()
        up.stop()


@pytest.mark.slow  # its own proxy
def test_cache_enabled_false_turns_it_off(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> None:
    tmp = tmp_path_factory.mktemp("off")
    up = start_upstream(certs, tmp)
    p = start_proxy(tmp, None, None, CACHE_TOML + "[cache]\nenabled = false\n" + upstream_toml(up, certs))
    try:
        path = "/crawl-data/CC-MAIN-2024-10/off.warc.gz"
        for _ in range(2):
            assert fetch(p, D, path)[0] == 200
        assert sum(1 for x in up.log() if x["path"] == path) == 2
        assert not (p.data_dir / "cache").exists()
        assert "politeproxy_cache_requests_total{" not in p.metrics()
    finally:
        p.stop()
        up.stop()


def test_a_cache_that_cannot_write_still_answers_from_upstream(env: Env) -> None:
    """A full or broken cache disk (here: its tmp directory replaced by a file) never fails an answer: the
    body is relayed whole, nothing is stored, and one warning says why."""
    tmp = env.a.data_dir / "cache" / "tmp"
    aside = tmp.with_name("tmp.aside")
    tmp.rename(aside)
    tmp.write_bytes(b"not a directory")
    path = "/crawl-data/CC-MAIN-2024-10/nowrite.warc.gz"
    try:
        for i in (1, 2):
            s, _h, body = fetch(env.a, D, path)
            assert s == 200 and body.startswith(b"hello from data.commoncrawl.org/crawl-data/")
            assert env.count(path) == i  # not stored: the second went upstream too
    finally:
        tmp.unlink()
        aside.rename(tmp)
    assert "cache: " in env.a.log() and "answering from upstream" in env.a.log()


def test_an_exempt_range_hit_takes_no_exempt_place(env: Env) -> None:
    """A range read of the columnar index is exempt (no slot, but an exempt place and the exempt ceiling);
    a hit takes neither: the pacer sees the first read only."""
    (env.files / "ex.parquet").write_bytes(b"p" * 5000)
    path = "/cc-index/table/ex.parquet"
    waits = metric(env.a, "politeproxy_wait_seconds_count", **{"class": "exempt"})
    for _ in range(3):
        s, _h, b = fetch(env.a, D, path, {"Range": "bytes=100-199"})
        assert (s, b) == (206, b"p" * 100)
    assert env.count(path) == 1
    assert metric(env.a, "politeproxy_wait_seconds_count", **{"class": "exempt"}) - waits == 1
