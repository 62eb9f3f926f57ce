"""What the static checks of deploy/ and grafana/ share: the file paths, the metric names the proxy exports,
the panels the dashboard must have, and small readers (YAML documents, dashboard queries, PromQL metric
names, promtool, compose bind mounts).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# Optional: without PyYAML the deploy tests that read YAML skip (pytest -p tests.support.without_optional).
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]

DEPLOY = ROOT / "deploy"

GRAFANA = ROOT / "grafana"

UNIT = DEPLOY / "politeproxy.service"

COMPOSE = DEPLOY / "docker-compose.yml"

K8S = DEPLOY / "k8s.yaml"

PROMETHEUS = DEPLOY / "prometheus.yml"

ALERTS = DEPLOY / "alerts.yml"

DOCKERFILE = DEPLOY / "Dockerfile"

DASHBOARD = GRAFANA / "dashboard.json"

DS_PROVISIONING = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"

DASH_PROVISIONING = GRAFANA / "provisioning" / "dashboards" / "politeproxy.yml"

# Every metric the proxy exports, with its type. A live-/metrics test cross-checks this list.
EXPECTED_METRICS = {
    "politeproxy_requests_total": "counter",
    "politeproxy_grants_total": "counter",
    "politeproxy_retries_total": "counter",
    "politeproxy_wait_seconds": "histogram",
    "politeproxy_queue_depth": "gauge",
    "politeproxy_achieved_rate": "gauge",
    "politeproxy_configured_rate": "gauge",
    "politeproxy_throttles_total": "counter",
    "politeproxy_backoff_seconds": "gauge",
    "politeproxy_rejected_total": "counter",
    "politeproxy_exempt_in_flight": "gauge",
    "politeproxy_bytes_total": "counter",
    "politeproxy_schedule_degraded": "gauge",
    "politeproxy_schedule_store": "gauge",
    "politeproxy_config_reloads_total": "counter",
    "politeproxy_tunnels_open": "gauge",
    "politeproxy_window_requests": "gauge",  # issue 24: the request window per service
    "politeproxy_window_limit": "gauge",
    "politeproxy_cache_requests_total": "counter",
    "politeproxy_cache_slots_saved_total": "counter",
    "politeproxy_cache_bytes": "gauge",
    "politeproxy_cache_evictions_total": "counter",
}

# Series names a query may use: histograms only through their _bucket/_sum/_count series.
ALLOWED_SERIES = {
    series
    for name, kind in EXPECTED_METRICS.items()
    for series in ([f"{name}_bucket", f"{name}_sum", f"{name}_count"] if kind == "histogram" else [name])
}

# Panel title -> fragments that must appear in that panel's queries.
REQUIRED_PANELS = {
    "Shared cache: hit ratio, slots saved, size": [
        'politeproxy_cache_requests_total{result="hit"}',
        "politeproxy_cache_slots_saved_total",
        "politeproxy_cache_bytes",
    ],
    "Global rate: achieved vs configured": [
        'politeproxy_achieved_rate{scope="global"}',
        "politeproxy_configured_rate",
        "sum(rate(politeproxy_grants_total[1m]))",
    ],
    "Achieved rate per host": ["politeproxy_achieved_rate", "politeproxy_grants_total"],
    "Queue depth per host": ["politeproxy_queue_depth"],
    "Paced wait time p50 / p95 / p99": [
        "histogram_quantile(0.5,",
        "histogram_quantile(0.95,",
        "histogram_quantile(0.99,",
        "politeproxy_wait_seconds_bucket",
    ],
    "Throttles by host and code": ["politeproxy_throttles_total", "by (host, code)"],
    "Backoff remaining per host": ["politeproxy_backoff_seconds"],
    "Exempt request rate": ['politeproxy_requests_total{class="exempt"'],
    "Exempt requests in flight": ["politeproxy_exempt_in_flight"],
    "Retries and rejections": ["politeproxy_retries_total", "politeproxy_rejected_total"],
    "Schedule store degraded": ["politeproxy_schedule_degraded"],
    "Proxies per active schedule store": ["politeproxy_schedule_store"],
    "Bytes rate by direction": ["politeproxy_bytes_total"],
    # issue 11: who spent the budget
    "Budget by pipeline": [
        "sum by (pipeline) (rate(politeproxy_grants_total",
        "histogram_quantile(0.5, sum by (le, pipeline)",
        "histogram_quantile(0.99, sum by (le, pipeline)",
        "sum by (pipeline, reason) (rate(politeproxy_rejected_total",
    ],
}

# PromQL words that are not metric names: functions, aggregations, keywords.
PROMQL_WORDS = {
    # aggregation operators and their modifiers
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile", "by", "without",
    # binary operator keywords and modifiers
    "and", "or", "unless", "on", "ignoring", "group_left", "group_right", "bool", "offset", "atan2",
    # literals
    "inf", "nan",
    # functions
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor",
    "histogram_count", "histogram_sum", "histogram_fraction", "histogram_quantile", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10",
    "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn", "sort",
    "sort_desc", "sqrt", "time", "timestamp", "vector", "year", "avg_over_time", "min_over_time",
    "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time", "stddev_over_time",
    "stdvar_over_time", "last_over_time", "present_over_time", "acos", "acosh", "asin", "asinh",
    "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad", "pi",
}  # fmt: skip

# Debian package that ships each external tool.
TOOL_PACKAGES = {"promtool": "prometheus", "systemd-analyze": "systemd"}

# Grafana interval macros, replaced by a fixed duration before promtool sees a query.
GRAFANA_DURATION_MACROS = ("__rate_interval", "__interval", "__range")


def require_tool(name: str) -> str:
    """Path of an executable; skip without it, but fail when running under CI."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not on PATH"
    if os.environ.get("CI"):
        pytest.fail(f"{message} and CI is set: apt-get install {TOOL_PACKAGES.get(name, name)}")
    pytest.skip(message)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def load_yaml_docs(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_panels(dashboard: dict) -> list[dict]:
    """All panels, including those nested in collapsed rows."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(record name, PromQL) for every query target of the dashboard."""
    queries = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            queries.append((f"dashboard:panel{panel['id']}_{target['refId']}", target["expr"]))
    return queries


def template_variables(dashboard: dict) -> list[str]:
    return [var["name"] for var in dashboard.get("templating", {}).get("list", [])]


def expand_grafana_variables(expr: str, variables: list[str]) -> str:
    """Turn a Grafana query into plain PromQL, as Grafana itself would before sending it."""
    for macro in GRAFANA_DURATION_MACROS:
        expr = re.sub(r"\$\{" + macro + r"\}|\$" + macro + r"\b", "5m", expr)
    for name in sorted(variables, key=len, reverse=True):
        expr = re.sub(r"\$\{" + name + r"(?::\w+)?\}|\$" + name + r"\b", ".*", expr)
    return expr


def metric_names(expr: str) -> set[str]:
    """Series names a PromQL expression selects (expects no __name__ matchers)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = re.sub(r"`[^`]*`", "``", text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    text = re.sub(r"(?<![\w:])\d[\d.]*(?:[eE][+-]?\d+)?", " ", text)  # numbers
    tokens = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text)
    return {t for t in tokens if t.lower() not in PROMQL_WORDS}


def promtool_check_exprs(tmp_path: Path, queries: list[tuple[str, str]]) -> None:
    """Feed PromQL expressions to promtool as recording rules; fail on any it rejects."""
    promtool = require_tool("promtool")
    rules = {"groups": [{"name": "check", "rules": [{"record": r, "expr": e} for r, e in queries]}]}
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    result = run([promtool, "check", "rules", str(rules_file)])
    assert result.returncode == 0, f"promtool rejected a query:\n{result.stdout}\n{result.stderr}"


def compose_bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(host path, container path) of a compose service's bind mounts."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                mounts.append((volume["source"], volume["target"]))
            continue
        source, _, rest = volume.partition(":")
        target = rest.split(":")[0]
        if source.startswith((".", "/", "~")):
            mounts.append((source, target))
    return mounts
