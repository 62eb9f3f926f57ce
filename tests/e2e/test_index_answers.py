"""The index server's answers kept and shared, and its rest after a warning (issue 43), counted from the fake
upstream's arrival log: two proxies on one data dir (the file store, one cache), plain clients through the
CONNECT tunnel (http.client, in threads, each its own pipeline) and real cdx_toolkit processes.

The index is paced at 10 ms here (the tests count requests, not the schedule) and rests 3 s after a warning
(pacing.index_rest; its 60 s default is shown on a virtual clock in tests/unit/pacing/test_index_rest.py).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.clients import run_py
from tests.support.index_clients import CRAWL, IX, get, index_arrivals, question
from tests.support.processes import cache_command, wait_for
from tests.support.proxy_proc import NO_ROBOTS, ProxyProc, start_proxy
from tests.support.upstream_proc import Certs, Upstream, start_upstream

pytestmark = pytest.mark.slow  # two proxies, cdx_toolkit processes and a 3 s rest: about 8 s

REST = 3.0
TOML = (
    NO_ROBOTS
    + '[schedule]\nbackend = "file"\nglobal_rate = "10ms"\n'
    + f'[pacing]\nretries = 0\nmax_wait = "10s"\nindex_rest = "{REST}s"\n'
    + '[hosts."index.commoncrawl.org"]\ninterval = "10ms"\n'
    + '[cache]\ncollinfo_ttl = "1s"\n'  # stale within the rest: served all the same (never fetched then)
)


@dataclass
class Env:
    up: Upstream
    a: ProxyProc
    b: ProxyProc


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("index-answers")
    up = start_upstream(certs, tmp)
    a = start_proxy(tmp, up, certs, TOML, data_dir=tmp / "data")
    b = start_proxy(tmp, up, certs, TOML, data_dir=tmp / "data")  # the same data dir: one cache, one store
    yield Env(up, a, b)
    a.stop()
    b.stop()
    up.stop()


@pytest.fixture
def fresh(env: Env) -> Env:
    """The upstream's log and controls reset; collinfo.json in the cache (as a client's first ask puts it)."""
    env.up.reset()
    assert get(env.a, "/collinfo.json")[0] == 200  # (the one test that rests the index waits it out)
    return env


def test_ten_askers_at_once_make_one_request_and_all_get_the_answer(fresh: Env) -> None:
    env = fresh
    env.up.control({"cdx_delay": 0.5})  # every asker comes while the answer is asked for
    q = question("ten.example")
    before = {r: questions(env, r) for r in ("kept", "shared", "asked")}
    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(get, (env.a, env.b)[i % 2], q, f"pipe{i}") for i in range(10)]
        answers = [f.result() for f in futures]
    assert index_arrivals(env.up, f"/{CRAWL}-index") == [q]  # one question reached the index server
    bodies = {body for _s, body, _h in answers}
    assert [s for s, _b, _h in answers] == [200] * 10 and len(bodies) == 1
    assert b"https://ten.example/page0" in bodies.pop()
    assert get(env.b, q)[1] == answers[0][1] and len(index_arrivals(env.up, f"/{CRAWL}-index")) == 1
    counted = {r: questions(env, r) - before[r] for r in ("kept", "shared", "asked")}
    assert counted["asked"] == 1 and counted["shared"] + counted["kept"] == 10, counted


def questions(env: Env, result: str) -> float:
    """politeproxy_index_questions_total{result=...} over both proxies."""
    return sum(p.metric("politeproxy_index_questions_total", f'result="{result}"') for p in (env.a, env.b))


def test_cdx_toolkit_processes_at_once_ask_each_question_once(fresh: Env, tmp_path: Path) -> None:
    env = fresh
    env.up.control({"cdx_delay": 0.5})
    code = """
        import json, cdx_toolkit
        cdx = cdx_toolkit.CDXFetcher(source="cc", crawl=["CC-MAIN-2024-20"])
        print(json.dumps([dict(c)["url"] for c in cdx.iter("toolkit.example/*", limit=2)]))
        """
    with ThreadPoolExecutor(3) as pool:
        runs = [
            pool.submit(
                run_py, (env.a, env.b)[i % 2], code, {"CDXT_CACHE_DIR": str(tmp_path / f"c{i}") + "/"}
            )
            for i in range(3)
        ]
        outs = [json.loads(r.result().strip().splitlines()[-1]) for r in runs]
    assert outs == [["https://toolkit.example/page0", "https://toolkit.example/page1"]] * 3
    asked = index_arrivals(env.up, f"/{CRAWL}-index")
    assert asked and len(asked) == len(set(asked)), asked  # each distinct question once (numpages, page 0)


def test_the_same_twelve_domain_run_twice_asks_nothing_the_second_time(fresh: Env) -> None:
    env = fresh
    domains = [f"d{i}.example" for i in range(12)]

    def run(cache_status: str) -> list[bytes]:
        out = []
        for i, d in enumerate(domains):
            s, body, h = get((env.a, env.b)[i % 2], question(d))
            assert s == 200, body
            assert h.get("Cache-Status") == f"politeproxy; {cache_status}", h  # issue 41's field
            out.append(body)
        return out

    first = run("fwd=miss; stored")
    assert len(index_arrivals(env.up, f"/{CRAWL}-index")) == 12
    env.up.reset()
    assert run("hit") == first
    assert index_arrivals(env.up) == []  # not one request to the index server the second time


def cdx_lines(p: ProxyProc, pipeline: str) -> list[tuple[float, str]]:
    """The proxy's CDX questions of ``pipeline`` in its access log: when each was granted (seconds of the
    day: end, less duration, plus wait) and its cache column."""
    line = (
        r"(\d\d):(\d\d):(\d\d),(\d{3}) INFO politeproxy\.access: .* GET "
        + rf"{re.escape(IX)}/{CRAWL}-index\?.* wait=([\d.]+)s .* duration=([\d.]+)s"
        + rf" .* pipeline={pipeline} cache=(\w+)"
    )
    granted = []
    for h, m, sec, ms, wait, took, cache in re.findall(line, p.log()):
        end = int(h) * 3600 + int(m) * 60 + int(sec) + int(ms) / 1000
        granted.append((end - float(took) + float(wait), cache))
    return granted


def q_line(p: ProxyProc, pipeline: str, n: int) -> tuple[float, str]:
    """The grant time and cache column of the last granted of the ``n`` CDX questions ``pipeline`` asked
    through ``p``, once all ``n`` lines are in the log. A line is written when its answer has gone out, so
    the client can hold the answer before its line is there (a's Q, a hit, was missing when the log was read,
    on a loaded box); and the last granted, not the last line: a hit granted after a slow miss can be
    written first."""
    wait_for(lambda: len(cdx_lines(p, pipeline)) >= n, 10, f"{n} access lines of {pipeline}")
    return max(cdx_lines(p, pipeline))


def test_the_asker_whose_turn_comes_first_asks(env: Env, certs: Certs, tmp_path: Path) -> None:
    """A question's lease is taken once its turn came, never across its queue wait: proxy a asks Q behind
    five questions of its own pipeline, proxy b (another pipeline, its fair turn sooner) asks Q after it.
    b's turn comes first, so b asks and a is answered from b's kept answer: Q reaches the index server once,
    before a's last questions. (Taken before the queue wait, a's lease would hold b until a asked.)"""
    slow = TOML.replace('interval = "10ms"', 'interval = "300ms"')
    a = start_proxy(tmp_path, env.up, certs, slow, data_dir=tmp_path / "data")
    b = start_proxy(tmp_path, env.up, certs, slow, data_dir=tmp_path / "data")
    try:
        assert get(a, "/collinfo.json")[0] == 200
        # b too: its first request pays for its leaf and its upstream connection, which on a loaded box took
        # long enough that four of bulk's questions went first (seen once in a full-suite run)
        assert get(b, "/collinfo.json")[0] == 200
        env.up.reset()
        q = question("turn.example")
        with ThreadPoolExecutor(7) as pool:
            bulk = [pool.submit(get, a, question(f"bulk{i}.example"), "bulk") for i in range(5)]
            time.sleep(0.2)  # bulk's five are queued (a question every 300 ms)
            mine = pool.submit(get, a, q, "bulk")  # a's Q: behind bulk's five
            time.sleep(0.1)
            theirs = pool.submit(get, b, q, "solo")  # b's Q: solo's first, its turn before bulk's backlog
            results = [f.result() for f in (*bulk, mine, theirs)]
        assert [s for s, _b, _h in results] == [200] * 7 and mine.result()[1] == theirs.result()[1]
        asked = index_arrivals(env.up, f"/{CRAWL}-index")
        assert asked.count(q) == 1, asked
        # Whoever's turn came first asked, and the other was answered from its kept answer: of the two Qs,
        # the one granted first (end - duration + wait, from the access lines) is the miss. Had a taken its
        # lease before its queue wait, b, granted sooner (its pipeline has no backlog), would have waited on
        # it and been a hit. Which turn comes first is the fair queue's business: b's usually, not always.
        (b_grant, b_cache), (a_grant, a_cache) = q_line(b, "solo", 1), q_line(a, "bulk", 6)
        assert sorted([b_cache, a_cache]) == ["hit", "miss"], (b_cache, a_cache)
        first = "b" if b_grant < a_grant else "a"
        assert (b_cache if first == "b" else a_cache) == "miss", (first, b_grant, a_grant, b_cache, a_cache)
    finally:
        a.stop()
        b.stop()


def test_a_question_retried_after_a_warning_keeps_its_lease(env: Env, certs: Certs, tmp_path: Path) -> None:
    """With retries on and a 1 s rest, a question answered 503 is retried by the proxy once the rest is
    over, holding the lease it took the first time (never waiting on its own lease), and then kept."""
    toml = TOML.replace("retries = 0", "retries = 2").replace(f'index_rest = "{REST}s"', 'index_rest = "1s"')
    p = start_proxy(tmp_path, env.up, certs, toml)
    try:
        assert get(p, "/collinfo.json")[0] == 200
        env.up.reset()
        env.up.control({"throttle": {"host": IX, "count": 1, "status": 503}})
        q = question("retried.example")
        t0 = time.monotonic()
        s, _b, h = get(p, q)
        took = time.monotonic() - t0
        print(f"retried after the 1 s rest: answered in {took:.2f}s")
        # Loose: the rest (1 s) and a retry, far from max_wait (10 s), which a wait on its own lease would add
        assert s == 200 and 1.0 <= took < 5.0 and h.get("Cache-Status") == "politeproxy; fwd=miss; stored"
        assert index_arrivals(env.up, q) == [q, q]  # the warned try and its retry
        assert get(p, q)[0] == 200 and index_arrivals(env.up, q) == [q, q]  # kept
    finally:
        p.stop()


def test_what_is_never_kept(fresh: Env) -> None:
    env = fresh
    empty, blank = question("empty.example"), question("blank.example")
    missing, other = question("a.example", "CC-MAIN-2099-10"), "/other?x=1"
    for q in (empty, blank, missing, other):
        for p in (env.a, env.b):
            get(p, q)
    assert index_arrivals(env.up, empty) == [empty, empty]  # pywb's empty 200: asked again
    assert index_arrivals(env.up, blank) == [blank, blank]  # whitespace only: the same
    assert index_arrivals(env.up, missing) == [missing, missing]  # a crawl collinfo.json does not list
    assert len(index_arrivals(env.up, "/other")) == 2
    nothing = question("nocaptures.example")
    s1, b1, _ = get(env.a, nothing)
    s2, b2, _ = get(env.b, nothing)
    assert (s1, s2) == (404, 404) and b1 == b2 and b"No Captures found" in b1
    assert index_arrivals(env.up, nothing) == [nothing]  # "No Captures found" is kept (for a day)


def test_cache_stats_shows_the_index_part_and_clear_index_clears_it_alone(fresh: Env) -> None:
    env = fresh
    q = question("cleared.example")
    assert get(env.a, q)[0] == 200

    def cli(*args: str) -> str:
        return cache_command(*args, "--data-dir", str(env.a.data_dir))

    assert re.search(r"index answers \(on\): [1-9]\d* entries", cli("stats"))
    assert re.search(r"cleared: [1-9]\d* index answers", cli("clear", "--index"))
    out = cli("stats")
    assert re.search(r"index answers \(on\): 0 entries", out) and re.search(r"^entries: [1-9]", out, re.M), (
        out
    )
    assert get(env.b, q)[0] == 200 and index_arrivals(env.up, q) == [q, q]  # asked again


def test_after_a_503_the_index_rests_and_kept_answers_are_served_at_once(fresh: Env) -> None:
    env = fresh
    kept = question("kept.example")
    assert get(env.a, kept)[0] == 200
    env.up.reset()
    env.up.control({"throttle": {"host": IX, "count": 1, "status": 503}})
    s, _b, h = get(env.a, question("warn.example"))
    warned = time.monotonic()
    assert s == 503 and int(h["Retry-After"]) >= REST
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(get, env.b, question("new.example"))  # waits out the rest (max_wait 10 s)
        # During the rest: a kept answer at once, from either proxy. Loose (a loaded 2-core box): "not held
        # for the rest", not how fast.
        for p in (env.a, env.b):
            t0 = time.monotonic()
            s, body, _h = get(p, kept)
            print(f"a kept answer during the rest: {time.monotonic() - t0:.3f}s")
            assert s == 200 and b"kept.example" in body and time.monotonic() - t0 < REST / 2
        time.sleep(max(0.0, 1.1 - (time.monotonic() - warned)))
        s, _b, h = get(env.b, "/collinfo.json")  # stale (collinfo_ttl 1 s), and not fetched during the rest
        assert s == 200 and int(h["Age"]) >= 1
        assert waiting.result()[0] == 200  # asked once the rest was over
    arrivals = [a for a in env.up.log() if a["host"] == IX]
    assert [a["path"] for a in arrivals] == [question("warn.example"), question("new.example")]
    # Strict: the rest starts once the 503 is read, after it arrived, so the next request comes REST later
    print(f"the next index request {arrivals[1]['t'] - arrivals[0]['t']:.2f}s after the 503 (rest {REST}s)")
    assert arrivals[1]["t"] - arrivals[0]["t"] >= REST
