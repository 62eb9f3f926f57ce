"""``politeproxy simulate`` (issue 24 item 6): the workload parser, the access-log reader, the window peak,
and the simulation itself on its virtual clock, run through the store's own claim (MemoryStore)."""

from __future__ import annotations

import argparse
import io
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from politeproxy.commands import simloop
from politeproxy.commands import simulate as sim
from politeproxy.config.loading import build
from politeproxy.observe.logs import AccessLog, JsonFormatter, PlainFormatter
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.classify import Klass
from politeproxy.policy.simulation import (
    DEFAULT_HOST,
    EXEMPT,
    MAX_LINE,
    MAX_STREAMS,
    PACED,
    Arrival,
    Stream,
    WorkloadError,
    access_arrival,
    arrivals,
    log_arrivals,
    parse_workload,
    peak,
)
from politeproxy.proxy.common.exchange import Exchange

INDEX = "index.commoncrawl.org"

# -- the workload parser --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "exempt=50/s,paced=5/s",
            [("default", EXEMPT, DEFAULT_HOST, 50.0), ("default", PACED, DEFAULT_HOST, 5.0)],
        ),
        ("a:paced=5/s, b:exempt=20/s", [("a", PACED, DEFAULT_HOST, 5.0), ("b", EXEMPT, DEFAULT_HOST, 20.0)]),
        ("paced@Index.CommonCrawl.org.=1/s", [("default", PACED, INDEX, 1.0)]),
        ("etl:paced@index.commoncrawl.org=120/m", [("etl", PACED, INDEX, 2.0)]),
        ("paced=3600/h,paced=1/s", [("default", PACED, DEFAULT_HOST, 2.0)]),  # one stream named twice adds
        ("paced = 5 / s", [("default", PACED, DEFAULT_HOST, 5.0)]),
    ],
)
def test_workloads_read(text: str, want: list[tuple[str, str, str, float]]) -> None:
    assert [(s.pipeline, s.klass, s.host, s.rate) for s in parse_workload(text)] == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty workload"),
        ("paced", "expected [PIPELINE:]CLASS"),
        ("slow=5/s", "the class is paced or exempt"),
        ("paced=0/s", "above 0"),
        ("paced=5", "expected a rate"),
        ("paced=nan/s", "expected a rate"),
        ("paced=20000/s", "at most 10000/s"),
        ("a b:paced=1/s", "pipeline"),
        ("paced@../etc=1/s", "not a host name"),
        ("paced@=1/s", "not a host name"),
        (",".join(f"p{i}:paced=1/s" for i in range(MAX_STREAMS + 1)), f"more than {MAX_STREAMS} streams"),
        ("paced=1/s," * 2000, "characters long"),
    ],
)
def test_bad_workloads_say_why(text: str, says: str) -> None:
    with pytest.raises(WorkloadError, match=None) as e:
        parse_workload(text)
    assert says in str(e.value) and "\n" not in str(e.value)


WORKLOAD_CHARS = st.text(alphabet="pacedxmt:@=,/shm .0123456789-_ab\n\x00é", max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=200), WORKLOAD_CHARS))
@example("a:exempt@commoncrawl.s3.amazonaws.com=1.5/s")
@example("::=@=")
def test_the_parser_returns_streams_or_a_clean_error(text: str) -> None:
    """Whatever the text: streams with a rate in (0, 10000] and a valid host, or WorkloadError (one line)."""
    try:
        got = parse_workload(text)
    except WorkloadError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert got and all(0 < s.rate <= 10_000 and s.klass in (PACED, EXEMPT) for s in got)


def test_arrivals_are_evenly_spaced_in_time_order() -> None:
    got = list(arrivals([Stream("a", PACED, DEFAULT_HOST, 2.0), Stream("b", EXEMPT, DEFAULT_HOST, 3.0)], 2.0))
    assert [a.t for a in got if a.pipeline == "a"] == [0.0, 0.5, 1.0, 1.5]
    assert len([a for a in got if a.pipeline == "b"]) == 6
    assert [a.t for a in got] == sorted(a.t for a in got)


# -- the window peak ------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 400), max_size=80), st.integers(1, 50))
def test_peak_is_the_most_any_trailing_window_holds(ticks: list[int], width: int) -> None:
    times = sorted(t / 4 for t in ticks)  # quarters: exact in floating point, ties included
    seconds = width / 4
    brute = max((sum(1 for u in times if t - seconds < u <= t) for t in times), default=0)
    assert peak(times, seconds) == brute


# -- the access log ----------------------------------------------------------------------------------------


def write_log(path: Path, formatter: logging.Formatter, lines: list[tuple[float, Exchange]]) -> None:
    """Access lines as the proxy writes them (AccessLog through the formatter), each logged at its time."""
    handler = logging.FileHandler(path)
    handler.setFormatter(formatter)
    times = iter([t for t, _ in lines])

    def stamp(record: logging.LogRecord) -> bool:
        record.created = next(times)
        record.msecs = (record.created % 1) * 1000
        return True

    handler.addFilter(stamp)
    logger = logging.getLogger("politeproxy.access")  # its name is on the line
    saved = logger.handlers[:], logger.propagate, logger.level
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        for _, ex in lines:
            AccessLog(logger).access(ex)
    finally:
        logger.handlers[:], logger.propagate, logger.level = saved
        handler.close()


def ex(host: str, klass: Klass, pipeline: str, duration: float, **kw: Any) -> Exchange:
    return Exchange(
        "127.0.0.1", "GET", host, "/crawl-data/x?...", klass, pipeline, 0.0, 200, 10, duration, **kw
    )


LOGGED = [
    (1000.5, ex(DEFAULT_HOST, Klass.PACED, "etl", 0.5)),  # arrived at 1000.0
    (1001.25, ex(DEFAULT_HOST, Klass.EXEMPT, "scan", 0.25)),  # 1001.0
    (1001.0, ex(INDEX, Klass.PACED, "etl", 0.5, retries=2)),  # 1000.5, three tries
    (1002.0, ex(DEFAULT_HOST, Klass.PACED, "etl", 0.0, cache="hit")),  # no slot: not replayed
    (1002.0, ex("example.com", Klass.PASSTHROUGH, "etl", 0.0)),  # not paced: not replayed
    (1003.0, ex(DEFAULT_HOST, Klass.PACED, "etl", 0.0, cache="miss")),  # 1003.0
]


@pytest.mark.parametrize("formatter", [PlainFormatter(), JsonFormatter()], ids=["plain", "json"])
def test_the_proxy_access_log_replays_as_its_requests(tmp_path: Path, formatter: logging.Formatter) -> None:
    path = tmp_path / "access.log"
    write_log(path, formatter, LOGGED)
    text = path.read_text()
    got = log_arrivals(
        ["2026-12-02 10:00:00,000 INFO politeproxy.start: listening", *text.splitlines()], 3600
    )
    want = [
        Arrival(0.0, "etl", PACED, DEFAULT_HOST),
        *[Arrival(0.5, "etl", PACED, INDEX)] * 3,
        Arrival(1.0, "scan", EXEMPT, DEFAULT_HOST),
        Arrival(3.0, "etl", PACED, DEFAULT_HOST),
    ]
    assert [(round(a.t, 3), a.pipeline, a.klass, a.host) for a in got] == [
        (a.t, a.pipeline, a.klass, a.host) for a in want
    ]
    assert len(log_arrivals(text.splitlines(), 2.0)) == 5  # --duration: the first 2 s of the log


def test_a_log_without_access_lines_is_a_clean_error() -> None:
    with pytest.raises(WorkloadError, match="no access lines"):
        log_arrivals(["hello", "{}", '{"logger": "politeproxy.access", "ts": "x"}'], 60)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
@example('{"logger": "politeproxy.access", "ts": 1e400, "class": "paced", "host": "data.commoncrawl.org"}')
@example('{"logger": "politeproxy.access", "ts": 5, "class": "paced", "host": 7, "duration": true}')
@example("2026-13-45 99:99:99,123 INFO politeproxy.access: c GET data.commoncrawl.org/ paced duration=1s")
@example("2026-01-01 00:00:00,123 INFO politeproxy.access: c GET h.org/ paced duration=9e9s retries=-1")
def test_any_line_is_a_request_or_nothing(line: str) -> None:
    r = access_arrival(line)
    assert r is None or (r.klass in (PACED, EXEMPT) and r.tries >= 1 and r.arrived == r.arrived)


# -- the simulation --------------------------------------------------------------------------------------


def run(s: PacingSettings, workload: str, seconds: float, shortcut: bool = True) -> simloop.Simulation:
    m = simloop.Simulation(s, shortcut)
    m.run(arrivals(parse_workload(workload), seconds))
    return m


def sends(m: simloop.Simulation, service: str = DEFAULT_HOST) -> list[float]:
    return [t - simloop.T0 for t in sorted(m.services[service].sends)]


def test_paced_requests_go_one_gap_apart() -> None:
    m = run(PacingSettings(gap=0.25), "paced=4/s", 60)
    got = sends(m)
    assert len(got) == 240 and m.services[DEFAULT_HOST].refused == 0
    assert got == [i * 0.25 for i in range(240)]


def test_the_index_keeps_its_interval_and_an_overload_is_refused_at_max_wait() -> None:
    m = run(PacingSettings(max_wait=10.0), "paced@index.commoncrawl.org=3/s", 120)
    got = sends(m, INDEX)
    assert min(b - a for a, b in zip(got, got[1:], strict=False)) >= 1.0 - 1e-9
    t = m.services[INDEX]
    assert t.refused > 0 and t.max_wait <= 10.0 and len(got) + t.refused == 360


def test_exempt_reads_get_their_burst_then_the_ceiling() -> None:
    m = simloop.Simulation(PacingSettings(exempt_rate=0.25, exempt_burst=8))
    m.run([Arrival(0.0, "default", EXEMPT, DEFAULT_HOST)] * 1000)
    got = sends(m)
    assert len(got) == 8 + 100 and m.services[DEFAULT_HOST].refused == 1000 - 108  # 25 s of max_wait
    assert got[:8] == [0.0] * 8  # the burst goes at once
    assert got[8:] == [0.25 * i for i in range(1, len(got) - 7)]  # then one per rate, up to max_wait ahead


WINDOWED = PacingSettings(exempt_rate=0.002, exempt_burst=100, window=10.0, window_limit=60)


def test_the_window_is_what_keeps_a_heavy_workload_under_its_limit() -> None:
    on = run(WINDOWED, "exempt=150/s,paced=5/s", 40)
    off = run(replace(WINDOWED, window_limit=0), "exempt=150/s,paced=5/s", 40)
    assert peak(sends(on), 10.0) <= 60  # every class together, in any trailing 10 s
    assert peak(sends(off), 10.0) > 1000
    assert on.services[DEFAULT_HOST].refused > 0


@pytest.mark.parametrize(
    ("s", "workload", "seconds"),
    [
        (PacingSettings(), "exempt=50/s,paced=5/s", 120),
        (WINDOWED, "a:exempt=40/s,b:paced=5/s,exempt@commoncrawl.s3.amazonaws.com=10/s", 20),
        (replace(WINDOWED, gap=0.0), "paced=30/s,paced@index.commoncrawl.org=2/s,exempt=20/s", 40),
    ],
    ids=["defaults", "windowed", "no-gap"],
)
def test_the_refusal_shortcut_changes_nothing(s: PacingSettings, workload: str, seconds: float) -> None:
    """The simulation skips the store for an exempt read a refusal already answered (nothing was written
    since): asking the store every time gives the same report."""
    streams = parse_workload(workload)
    fast = sim.simulate(s, arrivals(streams, seconds), seconds)
    slow = sim.simulate(s, arrivals(streams, seconds), seconds, shortcut=False)
    assert fast.pop("store_calls") < slow.pop("store_calls")
    assert fast == slow


def test_pipelines_share_the_paced_slots_fairly() -> None:
    r = sim.simulate(
        PacingSettings(), arrivals(parse_workload("a:paced=10/s,b:paced=1/s,c:paced=10/s"), 300), 300
    )
    p = r["pipelines"]
    assert p["b"]["refused"] == 0  # under its share (5/s / 3): everything goes
    # a and c split the rest: equal up to a few slots (a tie between equal tags goes to the first line)
    assert abs(p["a"]["requests"] - p["c"]["requests"]) <= 0.01 * p["a"]["requests"]
    assert p["a"]["requests"] + p["b"]["requests"] + p["c"]["requests"] <= 5 * 300 + 25 * 5  # the gap holds


# -- the command -----------------------------------------------------------------------------------------


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**({"workload": None, "log": None, "duration": "1h", "json": False} | kw))


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(args(workload="exempt=50/s,paced=5/s", duration="10m", json=True), build({})) == 0
    r = json.loads(capsys.readouterr().out)
    d = r["services"][DEFAULT_HOST]
    assert r["window_s"] == 300 and 600 <= r["duration_s"] <= 600 + 25
    assert d["window_limit"] == 4800 and d["cc_limit"] == 6000 and d["window_peak"] <= 4800
    assert d["requests"] + d["refused"] == d["offered"] == 600 * 55
    assert r["over_limit"] == [] and r["over_cc"] == []


def test_plain_report_names_a_peak_over_common_crawls_limit(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = build({"egress": {"limit": 0}, "exempt": {"rate": "50/s"}})
    assert sim.main(args(workload="exempt=50/s,paced=5/s", duration="6m"), cfg) == 0
    out = capsys.readouterr().out
    assert "data.commoncrawl.org" in out and "off" in out
    assert "OVER: data.commoncrawl.org (Common Crawl blocks above 6,000 per 300 s)" in out


def test_an_exempt_stream_no_rule_names_is_paced(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        sim.main(args(workload="exempt@index.commoncrawl.org=5/s", duration="1m", json=True), build({})) == 0
    )
    out = capsys.readouterr().out
    assert json.loads(out)["services"][INDEX]["requests"] <= 60 + 25  # the 1 s interval holds it


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"workload": "paced=5/s", "duration": "soon"}, "--duration"),
        ({"workload": "paced=5/s", "duration": "0"}, "above 0"),
        ({"workload": "paced@example.com=5/s"}, "not a paced host"),
        ({"workload": "paced=10000/s", "duration": "1h"}, "at most 2,000,000"),
        ({}, "give --workload"),
        ({"workload": "paced=5/s", "log": "x.log"}, "not both"),
        ({"log": "/nonexistent/access.log"}, "--log /nonexistent/access.log"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    kw: dict[str, Any], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sim.main(args(**kw), build({})) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("politeproxy: error: ") and says in err and "\n" not in err


def test_a_log_replays_through_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "access.log"
    write_log(path, PlainFormatter(), LOGGED)
    assert sim.main(args(log=str(path), json=True), build({})) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["services"][INDEX]["requests"] == 3 and r["services"][DEFAULT_HOST]["requests"] == 3
    assert r["pipelines"]["scan"]["requests"] == 1


def test_an_overlong_log_line_is_skipped_whole(tmp_path: Path) -> None:
    """A line longer than MAX_LINE (a file without newlines) is never held whole: its pieces are skipped,
    and the lines around it still count."""
    path = tmp_path / "access.log"
    write_log(path, JsonFormatter(), LOGGED[:2])
    first, second = path.read_text().splitlines()
    path.write_text(first + "\n" + "x" * (3 * MAX_LINE + 7) + "\n" + second + "\n" + "y" * (MAX_LINE + 1))
    with open(path) as f:
        lines = list(sim.bounded_lines(f))
    assert [line.strip() for line in lines] == [first, second]


def test_pipelines_beyond_the_proxys_bound_count_as_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pacer keeps FAIR_NAMES names a client brings (issue 27: 1,024, the metrics' labels fewer) and
    counts the rest as "other": the simulation's pipelines are the names the proxy would count. Here the
    bound is set to 50 to keep the run small."""
    monkeypatch.setattr("politeproxy.commands.simloop.FAIR_NAMES", 50)
    workload = ",".join(f"p{i}:paced=1/s" for i in range(60))
    r = sim.simulate(PacingSettings(), arrivals(parse_workload(workload), 10), 10)
    assert len(r["pipelines"]) == 51 and "p49" in r["pipelines"] and "p50" not in r["pipelines"]
    assert r["pipelines"]["other"]["requests"] + r["pipelines"]["other"]["refused"] == 10 * 10


def test_a_log_from_another_config_is_taken_as_this_config_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host this config does not pace is left out; an exempt read to a host no exempt rule of this config
    names is paced; the notes say so."""
    path = tmp_path / "access.log"
    lines = [
        (1000.0, ex("example.org", Klass.PACED, "etl", 0.0)),  # paced by the config that wrote the log
        (1000.0, ex(INDEX, Klass.EXEMPT, "etl", 0.0)),
        (1000.0, ex(INDEX, Klass.EXEMPT, "etl", 0.0)),
    ]
    write_log(path, PlainFormatter(), lines)
    assert sim.main(args(log=str(path)), build({})) == 0
    out = capsys.readouterr().out
    assert "note: not paced in this config, left out: example.org" in out
    assert f"note: no exempt rule names {INDEX}: its exempt reads are paced" in out
    assert "example.org" not in out.split("\n", 2)[2]  # no row of its own
    index_row = next(line for line in out.splitlines() if line.startswith(INDEX))
    assert index_row.split()[1:4] == ["2", "0", "0.50s"]  # both sent, the second an interval (1 s) later


@pytest.mark.timeout(60)  # the finding: it never ended
def test_simulate_log_dev_zero_never_ended() -> None:
    """Issue 42, item 11: ``--log /dev/zero`` (one endless line) read forever. A line longer than
    MAX_LONG_LINE, or a log beyond MAX_LOG characters, is no access log: a clean WorkloadError."""
    with (
        open("/dev/zero", encoding="utf-8", errors="replace") as f,
        pytest.raises(WorkloadError, match="line"),
    ):
        list(sim.bounded_lines(f))
    # endless short lines that are no access lines (what /dev/urandom gives): the total bound ends them
    many = io.StringIO("x\n" * 5000)
    with pytest.raises(WorkloadError, match="characters of log"):
        list(sim.bounded_lines(many, total=4096))
    # a long line within the bound is skipped, the lines around it kept
    text = io.StringIO("a\n" + "y" * 300 + "\nb\n")
    assert list(sim.bounded_lines(text, limit=100, longest=1000)) == ["a\n", "b\n"]
