"""The status document (politeproxy/observe/status.py, pacing/snapshot.py), its admin routes and the
terminal view (politeproxy/observe/statusview.py), in-process: a real Pacer on a MemoryStore with waiters put
in its lines, no dispatcher running, so every count is exact."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import re
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from rich.console import Console

from politeproxy.observe import status as status_mod
from politeproxy.observe import statuspage, statusview
from politeproxy.observe.admin import Admin
from politeproxy.observe.hostrows import host_state
from politeproxy.observe.metrics import Metrics
from politeproxy.observe.status import History, StatusBoard, StatusEvents
from politeproxy.pacing.pacer import Pacer, PacingSettings
from politeproxy.pacing.state import Waiter
from politeproxy.policy.backoff import BackoffPolicy, Kind
from politeproxy.policy.classify import Klass
from politeproxy.policy.fairness import PipelineRule
from politeproxy.stores.base import HostView, StoreError
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.memory import MemoryStore

D = "data.commoncrawl.org"
I = "index.commoncrawl.org"  # noqa: E741


def make_settings(**kw: Any) -> PacingSettings:
    base: dict[str, Any] = dict(gap=1.0, max_wait=60.0, host_intervals=((I, 1.0),))
    base.update(kw)
    return PacingSettings(**base)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(rand=lambda: 0.0)


@pytest.fixture
async def board(store: MemoryStore) -> AsyncIterator[StatusBoard]:
    events = StatusEvents(Metrics())
    pacer = Pacer(store, make_settings(), events)
    b = StatusBoard(pacer, events, [D, I], "memory", step=5.0)
    yield b
    await pacer.close()


def queue(pacer: Pacer, pipeline: str, host: str, n: int) -> None:
    """Put ``n`` waiters of ``pipeline`` in the host's line (the dispatcher is not running)."""
    loop = asyncio.get_running_loop()
    for _ in range(n):
        now = pacer.monotonic()
        pacer._state.add(Waiter(host, now, now + 60, loop.create_future(), pipeline))


def rows(doc: dict[str, Any], key: str, name: str) -> dict[str, dict[str, Any]]:
    return {r[name]: r for r in doc[key]}


async def test_expected_wait_follows_the_fair_queue_not_the_line_length(board: StatusBoard) -> None:
    """bulk has 6 queued, solo 1, equal weights: solo's next request goes after its own one and the two of
    bulk's whose start tags come first (3 gaps), bulk's after all 7 (7 gaps). FIFO would say 8 for solo."""
    queue(board.pacer, "bulk", D, 6)
    queue(board.pacer, "solo", D, 1)
    doc = await board.document()
    p = rows(doc, "pipelines", "pipeline")
    assert p["solo"]["expected_wait_s"] == pytest.approx(3.0)
    assert p["bulk"]["expected_wait_s"] == pytest.approx(7.0)
    assert p["bulk"]["queued"] == 6 and p["solo"]["queued"] == 1
    assert p["bulk"]["next_host"] == D and p["bulk"]["fair_share"] == pytest.approx(0.5)
    assert [r["pipeline"] for r in doc["pipelines"]] == ["bulk", "solo"]  # busiest first
    h = rows(doc, "hosts", "host")
    assert h[D]["queued"] == 7 and h[I]["queued"] == 0 and h[D]["state"] == "ok"
    assert h[I]["effective_interval_s"] == 1.0 and h[I]["configured_interval_s"] == 1.0
    assert doc["overall"]["queued"] == 7 and doc["overall"]["configured_rate"] == 1.0
    json.dumps(doc, allow_nan=False)


async def test_weights_and_configured_pipelines(board: StatusBoard) -> None:
    board.pacer.reload(make_settings(pipelines=(PipelineRule("big", 3.0), PipelineRule("idle", 1.0))))
    queue(board.pacer, "big", D, 4)
    queue(board.pacer, "small", D, 4)
    p = rows(await board.document(), "pipelines", "pipeline")
    assert p["big"]["weight"] == 3 and p["big"]["fair_share"] == pytest.approx(0.75)
    assert p["small"]["fair_share"] == pytest.approx(0.25)
    assert p["idle"]["queued"] == 0 and p["idle"]["fair_share"] is None  # configured: listed while idle
    # big's 4 go 3 to 1 against small: after its own 4, one of small's (the tags tie at 1) goes first.
    assert p["big"]["expected_wait_s"] == pytest.approx(6.0)


async def test_host_states_from_the_store(board: StatusBoard, store: MemoryStore) -> None:
    await store.throttled(D, 30.0, BackoffPolicy(), Kind.THROTTLE, 1.0)
    await store.throttled(I, None, BackoffPolicy(block_hold=120.0), Kind.BLOCK, 1.0)
    h = rows(await board.document(), "hosts", "host")
    assert h[D]["state"] == "backing off" and 25 <= h[D]["seconds_left"] <= 30
    assert h[D]["effective_interval_s"] > 1.0  # raised by the throttle (adaptive)
    assert h[I]["state"] == "blocked" and 100 <= h[I]["seconds_left"] <= 120


@pytest.mark.parametrize(
    ("view", "want"),
    [
        (HostView(), ("ok", 0.0)),
        (HostView(backoff_in=4.0, throttles=2), ("backing off", 4.0)),
        (HostView(backoff_in=9.0, blocks=1), ("blocked", 9.0)),
        (HostView(blocks=2, probe_in=12.0), ("blocked", 12.0)),
        (HostView(blocks=1), ("blocked", 0.0)),
        (None, ("unknown", 3.0)),
    ],
)
def test_host_state_table(view: HostView | None, want: tuple[str, float]) -> None:
    state, left, _detail = host_state(view, 3.0)
    assert (state, left) == want


async def test_a_store_that_fails_or_hangs_leaves_the_host_unknown(
    board: StatusBoard, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status_mod, "STORE_READ_TIMEOUT", 0.05)

    async def view(host: str) -> HostView:
        if host == D:
            raise OSError("store down")
        await asyncio.sleep(10)
        return HostView()

    monkeypatch.setattr(store, "host_view", view)
    doc = await board.document()
    assert {h["state"] for h in doc["hosts"]} == {"unknown"}
    json.dumps(doc, allow_nan=False)


async def test_tables_stay_bounded(board: StatusBoard) -> None:
    now = board.pacer.monotonic()
    for i in range(200):
        board.pacer._state.set_ready(f"h{i}.example", now + 50, now)
    for i in range(300):
        board.events.granted(D, 0.0, pipeline=f"p{i}")
    assert len(board.events.tallies) <= status_mod.MAX_TALLIES
    doc = await board.document()
    assert len(doc["hosts"]) == status_mod.MAX_HOSTS and doc["hosts_omitted"] == 202 - status_mod.MAX_HOSTS
    assert doc["hosts"][0]["host"] == D and doc["hosts"][1]["host"] == I  # the configured ones first
    assert len(doc["pipelines"]) == status_mod.MAX_PIPELINE_ROWS and doc["pipelines_omitted"] > 0


async def test_document_is_cached_briefly(board: StatusBoard) -> None:
    first = await board.document()
    queue(board.pacer, "x", D, 1)
    assert await board.document() is first  # within CACHE_FOR: the same document
    board._cached = None
    assert (await board.document())["overall"]["queued"] == 1


def test_events_reach_metrics_and_the_tallies() -> None:
    t = [100.0]
    m = Metrics()
    ev = StatusEvents(m, clock=lambda: t[0])
    for w in (0.5, 1.5, 2.5):
        ev.granted(D, 0.0, pipeline="a")
        ev.waited(D, Klass.PACED, w, pipeline="a")
    ev.waited(D, Klass.EXEMPT, 99.0, pipeline="a")  # exempt waits are not in the paced p50
    ev.waited(D, Klass.PACED, math.nan, pipeline="a")
    text = m.render().decode()
    assert 'politeproxy_grants_total{host="data.commoncrawl.org",pipeline="a"} 3.0' in text
    tally = ev.tallies["a"]
    assert tally.grants.count(t[0]) == 3 and tally.wait_p50(t[0]) == 1.5 and tally.last_host == D
    ev.retried(D)  # the proxy's events pass on too: it stands in for Metrics
    assert 'politeproxy_retries_total{host="data.commoncrawl.org"} 1.0' in m.render().decode()
    t[0] += 400
    ev.prune(t[0])
    assert ev.tallies == {}


def test_history_ring_is_bounded_and_measures_the_grants() -> None:
    h = History(5.0)
    assert h.points.maxlen == 180
    for i in range(400):
        h.sample(i * 5.0, 1e9 + i * 5.0, grants=i * 10, configured=2.0, queued=i % 3)
    assert len(h.points) == 180
    assert all(p[1] == 2.0 and p[2] == 2.0 for p in h.points)
    h.sample(400 * 5.0, 0, grants=0, configured=1.0, queued=0)  # a counter that went back: never negative
    assert h.points[-1][1] == 0.0


@pytest.mark.parametrize("raw", ["", "abc", "nan", "inf", "-1", "0", "0.1", "61", "1e308"])
def test_history_step_refuses_what_is_not_a_sane_step(raw: str) -> None:
    assert status_mod.history_step({"POLITEPROXY_STATUS_STEP": raw}) == status_mod.HISTORY_STEP


@given(st.text(max_size=30))
def test_history_step_is_always_finite_and_bounded(raw: str) -> None:
    """Any value of POLITEPROXY_STATUS_STEP gives a finite step within 0.5..60 s, without raising."""
    v = status_mod.history_step({"POLITEPROXY_STATUS_STEP": raw})
    assert math.isfinite(v) and 0.5 <= v <= 60.0


# -- admin routes ------------------------------------------------------------------------------------


def _admin(board: StatusBoard | None) -> Admin:
    return Admin(Metrics(), lambda: {}, lambda: b"pem", board.document if board else None)


async def test_admin_serves_status_and_the_page(board: StatusBoard) -> None:
    admin = _admin(board)
    r = await admin.handle(make_mocked_request("GET", "/status"))
    assert r.status == 200 and r.content_type == "application/json"
    assert json.loads(r.body)["overall"]["store"]["active"] == "memory"  # type: ignore[arg-type]
    page = await admin.handle(make_mocked_request("GET", "/"))
    assert page.status == 200 and page.headers["Content-Security-Policy"] == statuspage.CSP
    assert page.body == statuspage.PAGE
    assert (await _admin(None).handle(make_mocked_request("GET", "/"))).status == 404


async def test_a_broken_document_is_a_500_not_a_crash(board: StatusBoard) -> None:
    async def bad() -> dict[str, Any]:
        return {"x": math.nan}

    admin = Admin(Metrics(), lambda: {}, lambda: b"", bad)
    assert (await admin.handle(make_mocked_request("GET", "/status"))).status == 500


def test_the_csp_hashes_are_those_of_the_inline_blocks() -> None:
    html = statuspage.PAGE.decode()
    for tag, directive in (("script", "script-src"), ("style", "style-src")):
        body = re.search(rf"<{tag}>(.*?)</{tag}>", html, re.S)
        assert body is not None
        digest = base64.b64encode(hashlib.sha256(body.group(1).encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}'" in statuspage.CSP
    assert "innerHTML" not in html and "eval(" not in html  # names reach the page as text only


# -- the terminal view -------------------------------------------------------------------------------


def shown(doc: Any) -> str:
    c = Console(record=True, width=200, color_system=None)
    c.print(statusview.render(doc))
    return c.export_text()


async def test_view_shows_hosts_pipelines_and_rates(board: StatusBoard, store: MemoryStore) -> None:
    queue(board.pacer, "[bold]mark[/bold]", D, 2)
    queue(board.pacer, "esc\x1b[2Jx", D, 1)
    await store.throttled(I, 20.0, BackoffPolicy(), Kind.THROTTLE, 1.0)
    text = shown(await board.document())
    assert D in text and I in text and "backing off" in text
    assert "[bold]mark[/bold]" in text  # a name is text, never markup
    assert "\x1b" not in text and "esc?[2Jx" in text  # nor a terminal escape
    assert "configured 1.00/s" in text and "queued 3" in text


@settings(max_examples=40, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=6),
        max_leaves=30,
    )
)
def test_view_never_raises_on_any_document(doc: Any) -> None:
    """Whatever JSON an --admin URL answers (wrong types, NaN, missing keys), the view renders."""
    shown(doc)
    shown({"overall": doc, "hosts": [doc], "pipelines": [doc], "history": {"points": [doc, [0, doc, doc]]}})


def test_sparkline() -> None:
    pts = [[i, float(i % 5), 4.0, 0] for i in range(100)]
    line = statusview.sparkline(pts)
    assert len(line) == 60 and set(line) <= set(statusview.SPARK)
    assert statusview.sparkline("x") == "" and statusview.sparkline([[0, math.inf, None]]) == "▁"
    assert statusview.sparkline([[0, -2.0, 1.0]]) == "▁"  # a negative rate is drawn as none


@pytest.fixture
def tiny_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            seen.append(dict(self.headers))
            body = b"not json" if self.path.startswith("/bad") else json.dumps({"version": "t"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    th.start()
    yield f"127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()


def test_fetch_sends_credentials_as_proxy_authorization_and_ignores_proxy_variables(
    tiny_server: tuple[str, list[dict[str, str]]],
) -> None:
    addr, seen = tiny_server
    with mock.patch.dict(
        "os.environ", {"HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    ):
        assert statusview.fetch(f"http://me:s%40cret@{addr}") == {"version": "t"}
    assert seen[0]["Proxy-Authorization"] == "Basic " + base64.b64encode(b"me:s@cret").decode()
    with pytest.raises(statusview.StatusError, match="did not answer with JSON"):
        statusview.fetch(f"http://{addr}/bad")
    for bad in ("ftp://x", "http://", "http://[::1"):
        with pytest.raises(statusview.StatusError):
            statusview.fetch(bad)


def test_admin_url() -> None:
    assert statusview.admin_url("0.0.0.0", 3128) == "http://127.0.0.1:3128"
    assert statusview.admin_url("::1", 80) == "http://[::1]:80"


async def test_snapshot_busiest_host(board: StatusBoard) -> None:
    queue(board.pacer, "a", I, 1)
    queue(board.pacer, "a", D, 2)
    snap = board.pacer.snapshot()
    assert snap.busiest_host("a") == D and snap.busiest_host("b") is None
    assert snap.lines == {("a", I): 1, ("a", D): 2}


class DownStore(MemoryStore):
    """A shared store that does not answer (as Redis down): every read raises StoreError."""

    name = "redis"

    async def host_view(self, host: str) -> HostView:
        raise StoreError("connection refused")


async def test_a_failed_over_store_shows_as_degraded() -> None:
    store = FailoverStore(DownStore(), MemoryStore(), probe_interval=60.0)
    events = StatusEvents(Metrics())
    pacer = Pacer(store, make_settings(), events)
    b = StatusBoard(pacer, events, [D], "redis", step=5.0)
    try:
        before = b._overall(pacer.snapshot())["store"]
        assert before == {"backend": "redis", "active": "redis", "degraded": False}
        doc = await b.document()  # its host reads fail over to the local store
        assert doc["overall"]["store"] == {"backend": "redis", "active": "memory", "degraded": True}
        assert doc["hosts"][0]["state"] == "ok"  # answered by the fallback
    finally:
        await pacer.close()
        await store.close()


def test_the_cache_counts_and_hit_rate_reach_the_document_and_metrics() -> None:
    """Cache events pass on to metrics and are counted for /status: hit rate = hits / lookups."""
    m = Metrics()
    ev = StatusEvents(m)
    assert ev.cache_view()["hit_rate"] is None  # no lookup yet: unknown, not 0
    for result in ("miss", "hit", "hit", "hit", "bypass"):
        ev.cache_result(result, "etl")
    ev.cache_slot_saved("etl")
    ev.cache_size(1234)
    ev.cache_evicted(2)
    view = ev.cache_view()
    assert (view["hit"], view["miss"], view["bypass"], view["slots_saved"]) == (3, 1, 1, 1)
    assert view["hit_rate"] == 0.75 and view["bytes"] == 1234 and view["evicted"] == 2
    text = generate_latest(m.registry).decode()
    assert 'politeproxy_cache_requests_total{pipeline="etl",result="hit"} 3.0' in text, text
