"""The whole proxy from its workers' answers (observe/workermerge.py, workers.py): pure, no process."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from politeproxy.observe.metrics import Metrics
from politeproxy.observe.workermerge import merge_metrics, merge_status
from politeproxy.observe.workers import WorkerSet
from politeproxy.policy.classify import Klass

H = "data.commoncrawl.org"


def worker_text(grants: int) -> str:
    m = Metrics(clock=lambda: 100.0)
    for _ in range(grants):
        m.granted(H, 0.001, "default")
        m.waited(H, Klass.PACED, 0.01, "default")
    return m.render().decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_every_sample_gets_its_worker_label_and_the_counts_add_up() -> None:
    text = merge_metrics([(0, worker_text(3)), (1, worker_text(4))], 2).decode()
    grants = samples(text, "politeproxy_grants_total")
    mine = {k: v for k, v in grants.items() if ("host", H) in k}
    assert sorted(mine.values()) == [3.0, 4.0]
    assert {dict(k)["worker"] for k in mine} == {"0", "1"}
    assert sum(v for k, v in samples(text, "politeproxy_wait_seconds_count").items() if ("host", H) in k) == 7
    # the custom collector's gauge travels too, one series per worker
    rates = samples(text, "politeproxy_achieved_rate")
    assert {dict(k)["worker"] for k in rates} == {"0", "1"}
    workers = samples(text, "politeproxy_workers")
    assert workers[(("state", "answering"),)] == 2 and workers[(("state", "configured"),)] == 2
    assert text.count("# TYPE politeproxy_grants_total counter") == 1  # one family, not one per worker


def test_a_worker_that_did_not_answer_or_sent_garbage_is_left_out() -> None:
    text = merge_metrics([(0, worker_text(1)), (1, None), (2, "garbage{{ 1\n")], 3).decode()
    assert samples(text, "politeproxy_workers")[(("state", "answering"),)] == 1
    assert {dict(k)["worker"] for k in samples(text, "politeproxy_grants_total")} == {"0"}


def doc(pid: int, grants: int, queued: int, pipe_grants: int) -> dict:
    return {
        "worker": {"index": pid - 100, "pid": pid, "restarts": 0},
        "uptime_s": 5.0 + pid,
        "overall": {"achieved_rate": 1.5, "grants_since_start": grants, "queued": queued,
                    "exempt_waiting": 0, "exempt_in_flight": 1, "configured_rate": 5.0,
                    "cache": {"hit": 1, "miss": 1, "stale": 0, "bypass": 0, "bytes": 10, "hit_rate": 0.5}},
        "hosts": [{"host": H, "queued": queued, "exempt_in_flight": 1, "state": "ok"}],
        "pipelines": [{"pipeline": "default", "queued": queued, "exempt_waiting": 0,
                       "grants_last_minute": pipe_grants, "share": 1.0, "wait_p50_s": pid / 10,
                       "expected_wait_s": None}],
        "history": {"points": [[1.0, 1.0, 5.0, 1], [2.0, 2.0, 5.0, 2]], "partial": [3.0, 1.0, 5.0, 0]},
    }  # fmt: skip


def test_status_sums_what_each_worker_counts_and_lists_every_worker() -> None:
    merged = merge_status([(0, doc(100, 10, 2, 6)), (1, doc(101, 5, 3, 2)), (2, None)])
    assert merged is not None
    o = merged["overall"]
    assert (o["grants_since_start"], o["queued"], o["achieved_rate"], o["exempt_in_flight"]) == (
        15,
        5,
        3.0,
        2,
    )
    assert o["configured_rate"] == 5.0  # the shared budget, not a sum
    assert o["cache"]["hit"] == 2 and o["cache"]["bytes"] == 10 and o["cache"]["hit_rate"] == 0.5
    assert merged["hosts"] == [{"host": H, "queued": 5, "exempt_in_flight": 2, "state": "ok"}]
    [pipe] = merged["pipelines"]
    assert (pipe["queued"], pipe["grants_last_minute"], pipe["share"], pipe["wait_p50_s"]) == (
        5,
        8,
        1.0,
        10.1,
    )
    assert merged["history"]["points"][-1] == [2.0, 4.0, 5.0, 4]
    assert merged["uptime_s"] == 106.0
    assert "worker" not in merged
    rows = merged["workers"]
    assert [r["answering"] for r in rows] == [True, True, False]
    assert rows[1]["pid"] == 101 and rows[1]["grants_since_start"] == 5
    assert merge_status([(0, None)]) is None


def test_the_worker_variable_is_read_defensively() -> None:
    ws = WorkerSet(1, 2, 3, Path("/run/x:y"))
    assert WorkerSet.from_env({"POLITEPROXY_WORKER": ws.value()}) == ws  # a colon in the folder survives
    for bad in ("", "1:2:3", "2:2:0:/x", "a:2:0:/x", "0:2:0:", "0:99999:0:/x"):
        assert WorkerSet.from_env({"POLITEPROXY_WORKER": bad}) is None, bad
    assert WorkerSet.from_env({}) is None
