"""Per-key single flight (issue 25, item 5): a slow download and twenty requests for the same object never
delay a request for another object, the twenty follow the one upstream request as its body arrives, and
two proxies on one data dir still make one request.

The raw upstream (tests/support/misbehave.py) sends /crawl-data/slow* at 10,000 bytes every 0.25 s (about
5 s for the body). Clients: http.client through the CONNECT tunnel (the leader and its followers, in
threads, as requests would send it) and curl (the victim).
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import ssl
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from tests.support.cache_upstream import CACHE_TOML
from tests.support.misbehave import SLOW_SIZE, Misbehaving, answer_body
from tests.support.processes import need_tool, wait_for
from tests.support.proxy_proc import ProxyProc, start_proxy
from tests.support.upstream_proc import Certs

pytestmark = pytest.mark.slow  # two slow downloads of about 5 s each, and a second proxy

D = "data.commoncrawl.org"
FOLLOWERS = 20


@dataclass
class Env:
    a: ProxyProc
    b: ProxyProc
    up: Misbehaving


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cache-flight")
    up = Misbehaving("tls", certs.server_pem)
    text = CACHE_TOML + (
        f'[upstream]\nca_file = "{certs.ca_file}"\n[upstream.resolve]\n"{D}:443" = "127.0.0.1:{up.port}"\n'
    )
    a = start_proxy(tmp, None, None, text, data_dir=tmp / "data")
    b = start_proxy(tmp, None, None, text, data_dir=tmp / "data")  # the same cache directory
    yield Env(a, b, up)
    a.stop()
    b.stop()
    up.close()


@functools.cache
def client_tls(cafile: str) -> ssl.SSLContext:
    """One context for every client thread: loading the trust bundle per request costs ~0.1 s of CPU under
    the GIL, which twenty threads turn into seconds of the test's own making."""
    return ssl.create_default_context(cafile=cafile)


def get(p: ProxyProc, path: str) -> tuple[int, bytes, float]:
    """Status, body, and the seconds from the request to the body's first byte (through p's tunnel)."""
    proxy = urllib.parse.urlsplit(p.url)
    t0 = time.monotonic()
    c = http.client.HTTPSConnection(
        proxy.hostname or "", proxy.port, context=client_tls(p.env["SSL_CERT_FILE"]), timeout=60
    )
    try:
        c.set_tunnel(D, 443)
        c.request("GET", path)
        r = c.getresponse()
        first = r.read(1)
        ttfb = time.monotonic() - t0
        return r.status, first + r.read(), ttfb
    finally:
        c.close()


def curl_seconds(p: ProxyProc, path: str) -> tuple[str, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [need_tool("curl"), "-sS", "--max-time", "30", f"https://{D}{path}"],
        env=p.env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout, time.monotonic() - t0


def same_old_stripe(path: str) -> str:
    """A path whose key fell in the same one of 4,096 lock stripes as ``path``'s under the previous key
    format ("GET data <path> *", stripe = the first 3 hex digits of its SHA-256): the victim the old tree
    held behind the slow download. Under per-key single flight it shares nothing with it."""
    want = hashlib.sha256(f"GET data {path} *".encode()).hexdigest()[:3]
    for i in range(1_000_000):
        other = f"/crawl-data/CC-MAIN-2024-10/victim-{i}.warc.gz"
        if hashlib.sha256(f"GET data {other} *".encode()).hexdigest()[:3] == want:
            return other
    raise AssertionError("no colliding path")  # pragma: no cover - 4,096 tries expected


def test_a_victim_beside_a_slow_download_and_its_followers_is_answered_at_once(env: Env) -> None:
    slow = "/crawl-data/slow-1.warc.gz"
    victim = same_old_stripe(slow)
    _body, alone = curl_seconds(env.a, "/crawl-data/CC-MAIN-2024-10/alone.warc.gz")
    print(f"a miss alone: {alone:.3f}s")
    with ThreadPoolExecutor(FOLLOWERS + 1) as pool:
        leader = pool.submit(get, env.a, slow)
        wait_for(lambda: env.up.count(slow) == 1, 10, "the slow download upstream")
        followers = [pool.submit(get, env.a, slow) for _ in range(FOLLOWERS)]
        time.sleep(0.3)  # the followers are in (the upstream needs about 5 s for the body)
        body, seconds = curl_seconds(env.a, victim)
        print(f"victim answered in {seconds:.3f}s beside a slow download and {FOLLOWERS} followers")
        assert body == answer_body("tls", "GET", victim).decode()
        # Measured 0.16-0.6 s (a miss alone: 0.15-0.47 s, curl's start and TLS included) on a loaded 2-core
        # box; the old tree held it behind the download: 4.8 s. Loose: the bound says "not behind the
        # download", not how fast.
        assert seconds < 3.0
        assert not leader.done()  # the download was still running when the victim got its answer
        results = [leader.result(), *(f.result() for f in followers)]
    assert all(s == 200 and len(b) == SLOW_SIZE and b == b"s" * SLOW_SIZE for s, b, _t in results)
    assert env.up.count(slow) == 1  # one upstream request for the 21
    # The followers streamed the body as it arrived: their first bytes came long before its end (~5 s).
    ttfbs = sorted(t for _s, _b, t in results[1:])
    print(f"followers' first body byte after {ttfbs[0]:.2f}-{ttfbs[-1]:.2f}s")
    assert ttfbs[len(ttfbs) // 2] < 3.0


def test_two_proxies_on_one_cache_dir_make_one_request(env: Env) -> None:
    """The lease between processes: proxy b polls a's lease from its loop, then answers from the entry."""
    slow = "/crawl-data/slow-2.warc.gz"
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(get, env.a, slow)
        wait_for(lambda: env.up.count(slow) == 1, 10, "the slow download upstream")
        second = [pool.submit(get, env.b, slow) for _ in range(3)]
        _body, seconds = curl_seconds(env.b, "/crawl-data/CC-MAIN-2024-10/b-victim.warc.gz")
        assert seconds < 3.0  # b waits for a's lease on that key only
        results = [first.result(), *(f.result() for f in second)]
    assert all(s == 200 and b == b"s" * SLOW_SIZE for s, b, _t in results)
    assert env.up.count(slow) == 1


def get_or_cut(p: ProxyProc, path: str) -> tuple[str, int]:
    """("whole", bytes) for a complete answer, ("cut", bytes so far) for one that ended early."""
    try:
        status, body, _t = get(p, path)
    except http.client.IncompleteRead as e:
        return "cut", len(e.partial)
    except OSError:
        return "cut", 0
    return ("whole" if status == 200 else f"status {status}"), len(body)


def test_a_leader_cut_mid_body_cuts_its_followers_and_stores_nothing(env: Env) -> None:
    path = "/crawl-data/slowcut-1.warc.gz"
    with ThreadPoolExecutor(6) as pool:
        leader = pool.submit(get_or_cut, env.a, path)
        wait_for(lambda: env.up.count(path) == 1, 10, "the download upstream")
        followers = [pool.submit(get_or_cut, env.a, path) for _ in range(5)]
        results = [leader.result(), *(f.result() for f in followers)]
    assert all(kind == "cut" and n < SLOW_SIZE for kind, n in results), results  # never a short "whole"
    assert env.up.count(path) == 1
    assert get_or_cut(env.a, path)[0] == "cut" and env.up.count(path) == 2  # nothing was stored


def test_followers_of_an_answer_that_cannot_be_stored_go_upstream_at_once(env: Env) -> None:
    """No Content-Length: the leader's copy is never kept, so its followers do not wait for its end."""
    path = "/crawl-data/slownolen-1.warc.gz"
    with ThreadPoolExecutor(4) as pool:
        leader = pool.submit(get_or_cut, env.a, path)
        wait_for(lambda: env.up.count(path) == 1, 10, "the download upstream")
        for _ in range(3):
            pool.submit(get_or_cut, env.a, path)
        wait_for(lambda: env.up.count(path) == 4, 3, "the followers upstream on their own")
        assert not leader.done()  # the leader's download (about 5 s) was still running
