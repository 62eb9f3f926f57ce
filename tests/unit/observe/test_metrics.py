"""Metrics hygiene (issue 13): build info, zero label sets for the configured hosts, no _created series."""

from __future__ import annotations

import platform

from prometheus_client.parser import text_string_to_metric_families

from politeproxy import __version__
from politeproxy.observe.metrics import Metrics
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.fairness import PipelineRule

HOSTS = ["data.commoncrawl.org", "index.commoncrawl.org"]


def _samples(m: Metrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_build_info_names_version_and_python() -> None:
    got = _samples(Metrics())["politeproxy_build_info"]
    assert got == [({"version": __version__, "python": platform.python_version()}, 1.0)]


def test_no_created_series() -> None:
    m = Metrics()
    m.prepare(HOSTS, PacingSettings())
    m.answered("data.commoncrawl.org", "paced", 200, "p")
    text = m.render().decode()
    assert "_created" not in text


def test_configured_hosts_have_zero_series_before_any_request() -> None:
    m = Metrics()
    s = _samples(m)
    assert "politeproxy_requests_total" not in s  # before: "No data" on every per-host panel
    m.prepare(HOSTS, PacingSettings(pipelines=(PipelineRule("etl"),)))
    s = _samples(m)
    for name in ("politeproxy_requests_total", "politeproxy_grants_total", "politeproxy_queue_depth"):
        hosts = {labels["host"] for labels, value in s[name] if value == 0}
        assert hosts == set(HOSTS), name
    reqs = {
        (lb["host"], lb["class"], lb["code"], lb["pipeline"]) for lb, _v in s["politeproxy_requests_total"]
    }
    assert ("data.commoncrawl.org", "paced", "5xx", "etl") in reqs
    assert ("index.commoncrawl.org", "exempt", "2xx", "default") in reqs
    throttle_codes = {lb["code"] for lb, _v in s["politeproxy_throttles_total"]}
    assert {"503", "429", "403", "error"} <= throttle_codes
    waits = [lb for lb, _v in s["politeproxy_wait_seconds_count"] if lb["host"] == "data.commoncrawl.org"]
    assert {(lb["class"], lb["pipeline"]) for lb in waits} == {
        (k, p) for k in ("paced", "exempt") for p in ("default", "etl")
    }
    assert all(v == 0 for _lb, v in s["politeproxy_backoff_seconds"])


def test_prepare_is_bounded_by_the_config() -> None:
    """Series come from configured hosts and pipelines only: the count is fixed by the config."""
    m = Metrics()
    m.prepare(HOSTS, PacingSettings())
    n = sum(len(v) for v in _samples(m).values())
    m.prepare(HOSTS, PacingSettings())  # again (a reload would): nothing new
    assert sum(len(v) for v in _samples(m).values()) == n
    assert n < 1000
