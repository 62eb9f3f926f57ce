"""Static checks of grafana/: the dashboard's structure and required panels, its queries pass promtool
and use only exported metrics, and the provisioning files.

External tools: promtool (Debian package ``prometheus``) and systemd-analyze. When one is
missing the test skips locally but fails when the CI environment variable is set.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import pytest

from tests.support.deploy import (
    ALLOWED_SERIES,
    DASH_PROVISIONING,
    DS_PROVISIONING,
    EXPECTED_METRICS,
    REQUIRED_PANELS,
    dashboard_panels,
    dashboard_queries,
    expand_grafana_variables,
    load_dashboard,
    metric_names,
    promtool_check_exprs,
    template_variables,
)

yaml = pytest.importorskip("yaml")  # optional: the deploy files are YAML


def test_dashboard_structure():
    dashboard = load_dashboard()
    assert dashboard["uid"] and dashboard["title"]
    assert dashboard["schemaVersion"] >= 36
    panels = dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"

    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds_var = variables["DS_PROMETHEUS"]
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"

    # The provisioned data source's uid is the variable's default.
    provisioned = yaml.safe_load(DS_PROVISIONING.read_text(encoding="utf-8"))["datasources"]
    assert ds_var["current"]["value"] in {ds["uid"] for ds in provisioned}

    for panel in panels:
        assert "gridPos" in panel, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == "${DS_PROMETHEUS}"


def test_dashboard_has_required_panels():
    panels = {p["title"]: p for p in dashboard_panels(load_dashboard())}
    for title, fragments in REQUIRED_PANELS.items():
        assert title in panels, f"missing panel {title!r}"
        exprs = " ".join(t["expr"] for t in panels[title]["targets"])
        for fragment in fragments:
            assert fragment in exprs, f"panel {title!r} has no query with {fragment!r}"


def test_dashboard_queries_pass_promtool(tmp_path):
    dashboard = load_dashboard()
    variables = template_variables(dashboard)
    queries = [
        (record, expand_grafana_variables(expr, variables)) for record, expr in dashboard_queries(dashboard)
    ]
    for record, expr in queries:
        assert "$" not in expr, f"{record}: unexpanded Grafana variable in {expr!r}"
    promtool_check_exprs(tmp_path, queries)


def test_dashboard_uses_only_exported_metrics():
    dashboard = load_dashboard()
    variables = template_variables(dashboard)
    used: set[str] = set()
    for record, expr in dashboard_queries(dashboard):
        expr = expand_grafana_variables(expr, variables)
        assert "__name__" not in expr, f"{record}: select metrics by name, not by __name__"
        names = metric_names(expr)
        unknown = names - ALLOWED_SERIES
        assert not unknown, f"{record}: unknown metric(s) {sorted(unknown)} in {expr!r}"
        used |= names
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"]["query"])
            assert match, f"variable {var['name']}: unexpected query"
            assert match.group(1) in ALLOWED_SERIES
            used.add(match.group(1))
    # Every exported metric has a place on the dashboard.
    used_base = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in EXPECTED_METRICS else n for n in used}
    assert set(EXPECTED_METRICS) <= used_base, f"not on the dashboard: {set(EXPECTED_METRICS) - used_base}"


def test_metric_name_extraction():
    expr = (
        'histogram_quantile(0.95, sum by (le, host) (rate(politeproxy_wait_seconds_bucket{class="x"}[5m])))'
        " / on (host) group_left max(politeproxy_queue_depth offset 1h) > 1e3"
    )
    assert metric_names(expr) == {"politeproxy_wait_seconds_bucket", "politeproxy_queue_depth"}


def test_grafana_provisioning_files():
    datasources = yaml.safe_load(DS_PROVISIONING.read_text(encoding="utf-8"))
    assert datasources["apiVersion"] == 1
    assert [ds["type"] for ds in datasources["datasources"]] == ["prometheus"]
    dashboards = yaml.safe_load(DASH_PROVISIONING.read_text(encoding="utf-8"))
    assert dashboards["apiVersion"] == 1
    provider = dashboards["providers"][0]
    assert provider["type"] == "file"
    assert PurePosixPath(provider["options"]["path"]).is_absolute()
