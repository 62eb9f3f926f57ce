"""The alert for a proxy that is down (issue 13 item 8): deploy/alerts.yml's PoliteproxyDown through
``promtool check rules`` and a ``promtool test rules`` case (fires after 2 minutes of ``up == 0`` for the
politeproxy job only). The live /metrics hygiene check is in test_passage.py (it shares that proxy).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.processes import ROOT, need_tool

yaml = pytest.importorskip("yaml")  # optional: the alert rules are YAML

ALERTS = ROOT / "deploy" / "alerts.yml"


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
