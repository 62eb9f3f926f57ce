"""Static checks of the Prometheus files in deploy/: promtool accepts the config and the alert rules,
the scrape reaches the proxy, and the alerts use only metrics the proxy exports.

External tools: promtool (Debian package ``prometheus``) and systemd-analyze. When one is
missing the test skips locally but fails when the CI environment variable is set.
"""

from __future__ import annotations

import pytest

from tests.support.deploy import ALERTS, ALLOWED_SERIES, PROMETHEUS, metric_names, require_tool, run

yaml = pytest.importorskip("yaml")  # optional: the deploy files are YAML

# Series Prometheus writes itself for every scrape target (an alert on a proxy that is gone needs `up`).
SCRAPE_SERIES = {"up"}


def test_prometheus_config_passes_promtool():
    promtool = require_tool("promtool")
    result = run([promtool, "check", "config", str(PROMETHEUS)])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"


def test_prometheus_scrapes_the_proxy():
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    job = jobs["politeproxy"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert "politeproxy:3128" in targets
    for rule_file in config.get("rule_files", []):
        assert (PROMETHEUS.parent / rule_file).is_file(), f"{rule_file} is missing"


def test_alert_rules_pass_promtool_and_use_known_metrics():
    promtool = require_tool("promtool")
    result = run([promtool, "check", "rules", str(ALERTS)])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - ALLOWED_SERIES - SCRAPE_SERIES
            assert not unknown, f"alert {rule.get('alert')} uses unknown metrics {sorted(unknown)}"
