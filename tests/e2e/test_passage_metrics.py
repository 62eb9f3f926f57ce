"""Metrics hygiene on a live proxy, and the alert for a proxy that is down (issue 13 item 8).

/metrics of a proxy that has served nothing yet: build info, the configured hosts' label sets at 0, no
``_created`` series. deploy/alerts.yml's PoliteproxyDown through ``promtool check rules`` and a
``promtool test rules`` case (fires after 2 minutes of ``up == 0`` for the politeproxy job only).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from politeproxy import __version__
from tests.conftest import NO_ROBOTS, ROOT, ProxyProc, need_tool, start_proxy

ALERTS = ROOT / "deploy" / "alerts.yml"


@pytest.fixture(scope="module")
def idle_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProc]:
    p = start_proxy(tmp_path_factory.mktemp("hygiene"), None, None, NO_ROBOTS)
    yield p
    p.stop()


def test_fresh_proxy_metrics_are_tidy(idle_proxy: ProxyProc) -> None:
    text = idle_proxy.metrics()
    assert "_created" not in text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    info = [k for k in samples if k[0] == "politeproxy_build_info"]
    assert len(info) == 1 and ("version", __version__) in info[0][1] and samples[info[0]] == 1
    for host in ("data.commoncrawl.org", "index.commoncrawl.org"):
        for name in ("politeproxy_requests_total", "politeproxy_grants_total", "politeproxy_throttles_total"):
            mine = [v for (n, labels), v in samples.items() if n == name and ("host", host) in labels]
            assert mine and all(v == 0 for v in mine), (name, host)


def _expected_annotations(rule: dict, instance: str) -> dict[str, str]:
    return {k: v.replace("{{ $labels.instance }}", instance) for k, v in rule["annotations"].items()}


def test_proxy_down_alert_passes_promtool(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    down = next(r for r in rules if r.get("alert") == "PoliteproxyDown")
    instance = "politeproxy:3128"
    firing = {
        "exp_labels": {"severity": down["labels"]["severity"], "job": "politeproxy", "instance": instance},
        "exp_annotations": _expected_annotations(down, instance),
    }
    case = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # up at 0m and 1m, down from 2m on; another job's target is down all along
                    {"series": f'up{{job="politeproxy",instance="{instance}"}}', "values": "1 1 0 0 0 0 0"},
                    {"series": 'up{job="prometheus",instance="localhost:9090"}', "values": "0 0 0 0 0 0 0"},
                ],
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": "PoliteproxyDown", "exp_alerts": []},
                    {"eval_time": "3m", "alertname": "PoliteproxyDown", "exp_alerts": []},  # pending
                    {"eval_time": "5m", "alertname": "PoliteproxyDown", "exp_alerts": [firing]},
                ],
            }
        ],
    }
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(yaml.safe_dump(case, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
