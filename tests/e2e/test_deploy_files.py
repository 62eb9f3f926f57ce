"""Static checks of the deployment files in deploy/ and grafana/.

External tools: promtool (Debian package ``prometheus``) and systemd-analyze. When one is
missing the test skips locally but fails when the CI environment variable is set.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

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
}

# Series names a query may use: histograms only through their _bucket/_sum/_count series.
ALLOWED_SERIES = {
    series
    for name, kind in EXPECTED_METRICS.items()
    for series in ([f"{name}_bucket", f"{name}_sum", f"{name}_count"] if kind == "histogram" else [name])
}

# Panel title -> fragments that must appear in that panel's queries.
REQUIRED_PANELS = {
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


# ---------------------------------------------------------------- helpers


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


# ---------------------------------------------------------------- systemd unit

EXPECTED_EXECSTART = (
    "ExecStart=/usr/local/bin/politeproxy run --config /etc/politeproxy/politeproxy.toml "
    "--data-dir /var/lib/politeproxy"
)


def test_unit_hardening_settings():
    lines = UNIT.read_text(encoding="utf-8").splitlines()
    for setting in [
        EXPECTED_EXECSTART,
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "StateDirectory=politeproxy",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ]:
        assert setting in lines, f"{UNIT.name} lacks {setting!r}"
    assert "DynamicUser=yes" in lines or any(
        line.startswith("User=") and line != "User=root" for line in lines
    ), "the service must not run as root"


def test_unit_passes_systemd_analyze_verify(tmp_path):
    systemd_analyze = require_tool("systemd-analyze")
    # The binary is installed by pip on the target host, not here: point ExecStart at a stub
    # executable that exists and keep every other line (and the arguments) as they are.
    stub = tmp_path / "bin" / "politeproxy"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stub.chmod(0o755)
    original = UNIT.read_text(encoding="utf-8").splitlines(keepends=True)
    rewritten = [
        line.replace("ExecStart=/usr/local/bin/politeproxy ", f"ExecStart={stub} ", 1)
        if line.startswith("ExecStart=")
        else line
        for line in original
    ]
    changed = [i for i, (a, b) in enumerate(zip(original, rewritten, strict=True)) if a != b]
    assert len(changed) == 1, "expected exactly one ExecStart= line to rewrite"
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    copy = unit_dir / UNIT.name
    copy.write_text("".join(rewritten), encoding="utf-8")

    result = run([systemd_analyze, "verify", "--man=no", str(copy)])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and bad values are only warnings (exit status 0): none may name this unit.
    complaints = [line for line in output.splitlines() if UNIT.name in line or str(copy) in line]
    assert not complaints, "\n".join(complaints)


# ---------------------------------------------------------------- Prometheus


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
            unknown = metric_names(rule["expr"]) - ALLOWED_SERIES
            assert not unknown, f"alert {rule.get('alert')} uses unknown metrics {sorted(unknown)}"


# ---------------------------------------------------------------- docker


def test_dockerfile_basics_and_copy_sources():
    text = DOCKERFILE.read_text(encoding="utf-8")
    instructions = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            instructions.append((keyword.upper(), args.strip()))
    keywords = [k for k, _ in instructions]
    assert ("FROM", "python:3.11-slim") in instructions
    assert ("EXPOSE", "3128") in instructions
    assert any(k == "VOLUME" and "/var/lib/politeproxy" in a for k, a in instructions)
    users = [a for k, a in instructions if k == "USER"]
    assert users and not users[-1].startswith(("root", "0")), "the image must run as a non-root user"
    assert keywords.index("USER") < keywords.index("CMD")
    cmd = json.loads(dict(instructions)["CMD"])
    assert cmd[:3] == ["run", "--listen", "0.0.0.0:3128"]

    # The compose file builds with the repository root as context; COPY sources live there.
    missing = []
    for keyword, args in instructions:
        if keyword == "COPY" and not args.startswith("--from"):
            for source in shlex.split(args)[:-1]:
                if not source.startswith("--") and not (ROOT / source).exists():
                    missing.append(source)
    assert not missing, f"Dockerfile copies files missing from the repository root: {missing}"


def test_compose_file_parses_and_references_exist():
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    assert {"politeproxy", "redis", "prometheus", "grafana"} <= set(services)
    base = COMPOSE.parent
    declared_volumes = set(compose.get("volumes") or {})

    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            if isinstance(build, str):
                build = {"context": build}
            context = (base / build.get("context", ".")).resolve()
            assert context.is_dir(), f"{name}: build context {context} is missing"
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"
            assert dockerfile.resolve() == DOCKERFILE.resolve()
        for source, _ in compose_bind_mounts(service):
            assert (base / source).exists(), f"{name}: mounted {source} does not exist"
        for volume in service.get("volumes", []):
            if isinstance(volume, str) and not volume.startswith((".", "/", "~")):
                assert volume.split(":")[0] in declared_volumes, f"{name}: undeclared volume {volume}"
        for net in service.get("networks", []):
            assert net in (compose.get("networks") or {}), f"{name}: undeclared network {net}"


def test_compose_wiring_is_consistent():
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    base = COMPOSE.parent
    services = compose["services"]

    def mounts(service: str) -> dict[str, Path]:
        return {
            target: (base / source).resolve() for source, target in compose_bind_mounts(services[service])
        }

    # The proxy's config: Redis backend, and its allow list covers the compose network.
    proxy_mounts = mounts("politeproxy")
    config_path = proxy_mounts["/etc/politeproxy/politeproxy.toml"]
    config = tomllib.loads(config_path.read_text(encoding="utf-8"))
    assert config["schedule"]["backend"] == "redis"
    assert "redis://redis:" in config["schedule"]["redis_url"]
    allowed = [ipaddress.ip_network(c) for c in config["allow_clients"]]
    for net in compose["networks"].values():
        for pool in net.get("ipam", {}).get("config", []):
            subnet = ipaddress.ip_network(pool["subnet"])
            assert any(subnet.subnet_of(a) for a in allowed), f"{subnet} is not in allow_clients"

    # Prometheus gets its config and every rule file next to it.
    prom_mounts = mounts("prometheus")
    assert prom_mounts["/etc/prometheus/prometheus.yml"] == PROMETHEUS.resolve()
    prom_config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    for rule_file in prom_config.get("rule_files", []):
        target = str(PurePosixPath("/etc/prometheus") / rule_file)
        assert prom_mounts.get(target) == (PROMETHEUS.parent / rule_file).resolve(), target

    # Grafana gets the provisioning folder, and the dashboard lands where the provider looks.
    graf_mounts = mounts("grafana")
    assert graf_mounts["/etc/grafana/provisioning"] == (GRAFANA / "provisioning").resolve()
    provider = yaml.safe_load(DASH_PROVISIONING.read_text(encoding="utf-8"))["providers"][0]
    dashboard_targets = [t for t, src in graf_mounts.items() if src == DASHBOARD.resolve()]
    assert dashboard_targets, "grafana does not mount grafana/dashboard.json"
    assert PurePosixPath(dashboard_targets[0]).parent == PurePosixPath(provider["options"]["path"])


def test_compose_redis_has_a_password_and_only_the_proxies_reach_it():
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    redis, proxy = services["redis"], services["politeproxy"]
    # The password: one secret, from REDIS_PASSWORD (deploy/.env), never a default in the file.
    assert compose["secrets"]["redis_password"] == {"environment": "REDIS_PASSWORD"}
    assert redis["secrets"] == ["redis_password"]
    command = " ".join(redis["command"])
    assert "requirepass" in command and "/run/secrets/redis_password" in command
    assert "--requirepass" not in command  # not on the command line, where ps shows it
    assert "/run/secrets/redis_password" in " ".join(redis["healthcheck"]["test"])
    assert redis.get("user") not in (None, "root", "0", "0:0")
    url = proxy["environment"]["POLITEPROXY_REDIS_URL"]
    assert re.fullmatch(r"redis://:\$\{REDIS_PASSWORD:\?[^}]+\}@redis:6379/\d+", url), url
    # Redis is only on internal networks that no service but the proxy shares.
    for net in redis["networks"]:
        assert compose["networks"][net].get("internal") is True, net
        on_it = {name for name, svc in services.items() if net in svc.get("networks", [])}
        assert on_it == {"redis", "politeproxy"}, (net, on_it)
    assert "ports" not in redis


# ---------------------------------------------------------------- kubernetes


def _env(container: dict) -> list[dict]:
    return container.get("env", [])


def test_k8s_redis_has_a_password_and_a_network_policy():
    docs = load_yaml_docs(K8S)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    redis = deployments["politeproxy-redis"]["spec"]["template"]
    proxy = deployments["politeproxy"]["spec"]["template"]
    secret_ref = {"secretKeyRef": {"name": "politeproxy-redis", "key": "password"}}

    redis_c = redis["spec"]["containers"][0]
    assert {"name": "REDIS_PASSWORD", "valueFrom": secret_ref} in _env(redis_c)
    run = " ".join(redis_c.get("command", []) + redis_c.get("args", []))
    assert "requirepass" in run and "$REDIS_PASSWORD" in run and "--requirepass" not in run
    probe = " ".join(redis_c["readinessProbe"]["exec"]["command"])
    assert "REDISCLI_AUTH" in probe

    proxy_c = proxy["spec"]["containers"][0]
    env = _env(proxy_c)
    names = [e["name"] for e in env]
    assert {"name": "REDIS_PASSWORD", "valueFrom": secret_ref} in env
    url = next(e["value"] for e in env if e["name"] == "POLITEPROXY_REDIS_URL")
    assert url.startswith("redis://:$(REDIS_PASSWORD)@politeproxy-redis:"), url
    # Kubernetes expands $(VAR) only from variables defined earlier in the list.
    assert names.index("REDIS_PASSWORD") < names.index("POLITEPROXY_REDIS_URL")

    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    redis_labels = redis["metadata"]["labels"]
    guarding = [
        p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= redis_labels.items()
    ]
    assert guarding, "no NetworkPolicy selects the Redis pods"
    for policy in guarding:
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, peer  # pods only: no namespace or CIDR
                assert peer["podSelector"]["matchLabels"].items() <= proxy["metadata"]["labels"].items()
            assert [p["port"] for p in rule["ports"]] == [6379]


def test_k8s_manifest_parses_and_is_consistent():
    docs = load_yaml_docs(K8S)
    by_kind: dict[str, dict[str, dict]] = {}
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    assert {"ConfigMap", "Deployment", "Service"} <= set(by_kind)

    configmap = by_kind["ConfigMap"]["politeproxy-config"]
    config = tomllib.loads(configmap["data"]["politeproxy.toml"])
    assert config["schedule"]["backend"] == "redis"
    for cidr in config["allow_clients"]:
        ipaddress.ip_network(cidr)

    # redis_url names a Service of this manifest.
    redis_host = re.match(r"redis://([^:/]+)", config["schedule"]["redis_url"]).group(1)
    assert redis_host in by_kind["Service"], f"no Service named {redis_host}"

    deployments = by_kind["Deployment"]
    proxy = deployments["politeproxy"]
    assert config["schedule"]["expected_proxies"] == proxy["spec"]["replicas"]

    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        labels = pod["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), f"{name}: selector does not match its pods"
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        assert not any("hostPath" in v for v in volumes.values()), f"{name} uses a hostPath volume"
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in by_kind["ConfigMap"]
        containers = pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
        for container in containers:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}/{container['name']}: no volume {mount['name']}"

    # The proxy reads the config where the ConfigMap is mounted, and keeps its data on a volume.
    container = proxy["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    config_file = PurePosixPath(args[args.index("--config") + 1])
    data_dir = args[args.index("--data-dir") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    proxy_volumes = {v["name"]: v for v in proxy["spec"]["template"]["spec"]["volumes"]}
    assert "configMap" in proxy_volumes[mounts[str(config_file.parent)]]
    assert config_file.name in configmap["data"]
    assert data_dir in mounts
    assert args[args.index("--listen") + 1] == "0.0.0.0:3128"

    # Every Service selects some Deployment's pods and targets a port they declare.
    for name, service in by_kind["Service"].items():
        selector = service["spec"]["selector"]
        matching = [
            d
            for d in deployments.values()
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert matching, f"Service {name} selects no pods"
        ports = {
            p.get("name"): p["containerPort"]
            for d in matching
            for c in d["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in ports or target in ports.values(), f"Service {name}: no port {target}"


def test_deploy_toml_files_parse():
    for path in sorted(DEPLOY.glob("*.toml")):
        config = tomllib.loads(path.read_text(encoding="utf-8"))
        assert config["schedule"]["backend"] in {"memory", "file", "redis"}, path.name
        if not config.get("listen", "127.0.0.1:3128").startswith(("127.", "[::1]", "localhost")):
            assert config.get("allow_clients") or config.get("auth", {}).get("users"), path.name


# ---------------------------------------------------------------- grafana


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


def deploy_configs() -> list[tuple[str, str]]:
    """(name, TOML text) of every proxy config shipped in deploy/, including the ConfigMap's."""
    configs = [(p.name, p.read_text(encoding="utf-8")) for p in sorted(DEPLOY.glob("*.toml"))]
    for doc in load_yaml_docs(K8S):
        if doc["kind"] == "ConfigMap":
            for key, text in doc["data"].items():
                if key.endswith(".toml"):
                    configs.append((f"k8s.yaml:{key}", text))
    return configs


def test_deploy_configs_pass_the_proxys_own_validation():
    from politeproxy import config as proxy_config

    names = [name for name, _ in deploy_configs()]
    assert {"politeproxy.toml", "container.toml", "k8s.yaml:politeproxy.toml"} <= set(names)
    for name, text in deploy_configs():
        try:
            proxy_config.build(tomllib.loads(text), name)
        except proxy_config.ConfigError as e:
            pytest.fail(f"{name}: {e}")


def test_deploy_redis_urls_with_the_password_reach_the_config():
    """The env override the deploy files set is what the proxy's config ends up using."""
    from politeproxy import config as proxy_config

    password = "0123abcd" * 8
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    url = re.sub(
        r"\$\{REDIS_PASSWORD[^}]*\}",
        password,
        compose["services"]["politeproxy"]["environment"]["POLITEPROXY_REDIS_URL"],
    )
    docs = load_yaml_docs(K8S)
    proxy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "politeproxy")
    env = proxy["spec"]["template"]["spec"]["containers"][0]["env"]
    k8s_url = next(e["value"] for e in env if e["name"] == "POLITEPROXY_REDIS_URL").replace(
        "$(REDIS_PASSWORD)", password
    )
    configs = dict(deploy_configs())
    for name, want in (("politeproxy.toml", url), ("k8s.yaml:politeproxy.toml", k8s_url)):
        overrides = proxy_config.env_overrides({"POLITEPROXY_REDIS_URL": want})
        cfg = proxy_config.build(tomllib.loads(configs[name]), name, overrides)
        assert cfg["schedule"]["redis_url"] == want and f":{password}@" in want, name
