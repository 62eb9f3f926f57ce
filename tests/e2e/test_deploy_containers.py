"""Static checks of the container deployments in deploy/: the Dockerfile, the compose file and the
Kubernetes manifest (wiring, Redis passwords, network policy), and the TOML configs they ship, run
through the proxy's own validation.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest

from tests.support.deploy import (
    COMPOSE,
    DASH_PROVISIONING,
    DASHBOARD,
    DEPLOY,
    DOCKERFILE,
    GRAFANA,
    K8S,
    PROMETHEUS,
    ROOT,
    compose_bind_mounts,
    load_yaml_docs,
)

yaml = pytest.importorskip("yaml")  # optional: the deploy files are YAML


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

    _check_services_reach_pods(by_kind["Service"], deployments)


def _check_services_reach_pods(services: dict[str, dict], deployments: dict[str, dict]) -> None:
    """Every Service selects some Deployment's pods and targets a port they declare."""
    for name, service in services.items():
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
    from politeproxy.config import loading as proxy_config

    names = [name for name, _ in deploy_configs()]
    assert {"politeproxy.toml", "container.toml", "k8s.yaml:politeproxy.toml"} <= set(names)
    for name, text in deploy_configs():
        try:
            proxy_config.build(tomllib.loads(text), name)
        except proxy_config.ConfigError as e:
            pytest.fail(f"{name}: {e}")


def test_deploy_redis_urls_with_the_password_reach_the_config():
    """The env override the deploy files set is what the proxy's config ends up using."""
    from politeproxy.config import loading as proxy_config

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
