"""Kept index answers on the redis store (issue 43 item 2): two proxies with data dirs (and disk caches) of
their own, sharing one Redis, ask the index server once for ten askers at once, and the second proxy answers
a question the first one asked; kept answers in Redis stay within their bound, the oldest out first.
Counted from the fake upstream's arrival log; the clients are tests/e2e/test_index_answers.py's."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support.clients import run_py
from tests.support.index_clients import CRAWL, get, index_arrivals, question
from tests.support.processes import cache_command
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.redis_server import RedisServer, redis_fixture
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pytestmark = pytest.mark.slow  # two proxies, a redis-server and cdx_toolkit processes: about 8 s

redis_one = redis_fixture("redis_one", scope="module")  # the system redis-server


@dataclass
class Env:
    up: Upstream
    a: ProxyProc
    b: ProxyProc
    redis: redis.Redis
    prefix: str


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, certs: Certs, redis_one: RedisServer) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("index-redis")
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    toml = (
        NO_ROBOTS
        + f'[schedule]\nbackend = "redis"\nredis_url = "{redis_one.url}"\nredis_prefix = "{prefix}"\n'
        + 'global_rate = "10ms"\n[pacing]\nretries = 0\nmax_wait = "5s"\n'
        + '[hosts."index.commoncrawl.org"]\ninterval = "10ms"\n'
        + '[cache]\nindex_redis_max_size = "20KiB"\n'
    )
    up = start_upstream(certs, tmp)
    a = start_proxy(tmp, up, certs, toml, data_dir=tmp / "data-a")  # each its own data dir and cache
    b = start_proxy(tmp, up, certs, toml, data_dir=tmp / "data-b")
    client = redis.Redis.from_url(redis_one.url)
    yield Env(up, a, b, client, prefix)
    client.close()
    a.stop()
    b.stop()
    up.stop()


def test_two_proxies_of_their_own_data_dirs_ask_once_for_ten_askers(env: Env) -> None:
    for p in (env.a, env.b):  # each proxy's own cache holds collinfo.json (the list of published crawls)
        assert get(p, "/collinfo.json")[0] == 200
    env.up.reset()
    env.up.control({"cdx_delay": 0.5})  # every asker comes while the answer is asked for
    q = question("redis.example")
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda i: get((env.a, env.b)[i % 2], q, f"pipe{i}"), range(10)))
    assert index_arrivals(env.up, f"/{CRAWL}-index") == [q]
    assert [s for s, _b, _h in answers] == [200] * 10 and len({b for _s, b, _h in answers}) == 1
    # One proxy asked; a question asked on a only is answered on b from Redis, and kept on b's disk too
    only_a = question("only-a.example")
    assert get(env.a, only_a)[0] == 200
    s, body, _h = get(env.b, only_a)
    assert s == 200 and b"only-a.example" in body
    assert index_arrivals(env.up, only_a) == [only_a]
    env.redis.flushdb()  # Redis forgets: b still has its own copy
    assert get(env.b, only_a)[1] == body and index_arrivals(env.up, only_a) == [only_a]


def test_cdx_toolkit_on_two_proxies_of_their_own_data_dirs_asks_each_question_once(
    env: Env, tmp_path: Path
) -> None:
    env.up.reset()
    env.up.control({"cdx_delay": 0.5})
    code = """
        import json, cdx_toolkit
        cdx = cdx_toolkit.CDXFetcher(source="cc", crawl=["CC-MAIN-2024-20"])
        print(json.dumps([dict(c)["url"] for c in cdx.iter("toolkit-redis.example/*", limit=2)]))
        """
    with ThreadPoolExecutor(4) as pool:
        runs = [
            pool.submit(
                run_py, (env.a, env.b)[i % 2], code, {"CDXT_CACHE_DIR": str(tmp_path / f"c{i}") + "/"}
            )
            for i in range(4)
        ]
        outs = [json.loads(r.result().strip().splitlines()[-1]) for r in runs]
    urls = ["https://toolkit-redis.example/page0", "https://toolkit-redis.example/page1"]
    assert outs == [urls] * 4
    asked = index_arrivals(env.up, f"/{CRAWL}-index")
    assert asked and len(asked) == len(set(asked)), asked  # each distinct question once, across both proxies


def test_kept_answers_in_redis_stay_within_their_bound_oldest_out(env: Env) -> None:
    env.up.reset()
    for i in range(40):  # about 800 bytes each: 40 of them are well over the 20 KiB bound
        assert get(env.a, question(f"bound{i}.example"))[0] == 200
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not env.redis.zcard(f"{env.prefix}ix:order"):
        time.sleep(0.05)
    total = int(env.redis.hget(f"{env.prefix}ix:sizes", "#total") or 0)
    names = env.redis.zrange(f"{env.prefix}ix:order", 0, -1)
    assert 0 < total <= 20 * 1024 and 10 < len(names) < 40, (total, len(names))
    # The newest are kept, the oldest went: b finds the last one in Redis, the first one it must ask for
    first, last = question("bound0.example"), question("bound39.example")
    assert get(env.b, last)[0] == 200 and index_arrivals(env.up, last) == [last]
    assert get(env.b, first)[0] == 200 and index_arrivals(env.up, first) == [first, first]


def test_cache_stats_and_clear_index_reach_redis(env: Env) -> None:
    def cli(*args: str) -> str:
        return cache_command(*args, "--config", str(env.a.config_path), "--data-dir", str(env.a.data_dir))

    assert get(env.a, question("cli.example"))[0] == 200
    assert re.search(r"index answers in Redis: [1-9]\d* entries", cli("stats"))
    assert re.search(r"cleared in Redis: [1-9]\d* index answers", cli("clear", "--index"))
    assert "index answers in Redis: 0 entries, 0 bytes" in cli("stats")
