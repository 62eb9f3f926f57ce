"""The deploy files where pipelines can reach only the proxy (issue 45 item 1), checked as the other deploy
files are (YAML, the proxy's own config checks, cross-references): the compose override's internal
network that only the proxy shares, and the Kubernetes egress NetworkPolicy that lets a labelled pod reach
the proxy's port and DNS, and nothing else."""

from __future__ import annotations

import ipaddress
import tomllib
from urllib.parse import urlsplit

import pytest

from tests.support.deploy import COMPOSE, DEPLOY, K8S, load_yaml_docs

yaml = pytest.importorskip("yaml")  # optional: the deploy files are YAML

OVERRIDE = DEPLOY / "docker-compose.pipelines.yml"
K8S_PIPELINES = DEPLOY / "k8s-pipelines.yaml"
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE")


def _merged() -> dict:
    """The two compose files as `docker compose -f A -f B` merges these keys: services and networks by name,
    a service's network list replaced by the override's (which names all of the proxy's)."""
    base = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    over = yaml.safe_load(OVERRIDE.read_text(encoding="utf-8"))
    assert over["name"] == base["name"]  # one project: the override adds to it
    for name, service in over["services"].items():
        base["services"].setdefault(name, {}).update(service)
    base["networks"].update(over["networks"])
    return base


def test_compose_pipelines_share_an_internal_network_with_the_proxy_only() -> None:
    compose = _merged()
    services, networks = compose["services"], compose["networks"]
    pipeline, proxy = services["pipeline"], services["politeproxy"]
    # The proxy keeps its own networks (the way out, the schedule's Redis) and joins the pipelines'.
    base = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["politeproxy"]["networks"]
    assert set(base) < set(proxy["networks"])
    assert pipeline["networks"] == ["pipelines"]
    for net in pipeline["networks"]:
        assert networks[net].get("internal") is True, net  # no route out
        on_it = {name for name, svc in services.items() if net in svc.get("networks", [])}
        assert on_it == {"pipeline", "politeproxy"}, on_it
    env = pipeline["environment"]
    for var in PROXY_VARS:
        url = urlsplit(env[var])
        assert (url.scheme, url.hostname, url.port) == ("http", "politeproxy", 3128), env[var]
    assert "politeproxy" in env["NO_PROXY"].split(",")  # the CA is fetched from the proxy directly
    assert {env[v] for v in CA_VARS} == {"/tmp/trust-bundle.pem"}
    assert "/tmp/trust-bundle.pem" in " ".join(pipeline["entrypoint"])
    assert "http://politeproxy:3128/ca.pem" in " ".join(pipeline["entrypoint"])


def test_compose_pipelines_subnet_is_allowed_by_the_proxy_config() -> None:
    from politeproxy.config import loading

    compose = _merged()
    text = (DEPLOY / "politeproxy.toml").read_text(encoding="utf-8")
    cfg = loading.build(tomllib.loads(text), "politeproxy.toml", {})  # the proxy's own checks pass
    assert cfg.listen[1] == 3128
    allowed = [ipaddress.ip_network(c) for c in tomllib.loads(text)["allow_clients"]]
    for pool in compose["networks"]["pipelines"]["ipam"]["config"]:
        subnet = ipaddress.ip_network(pool["subnet"])
        assert any(subnet.subnet_of(a) for a in allowed), f"{subnet} is not in allow_clients"


def _proxy_side() -> tuple[dict, dict]:
    docs = load_yaml_docs(K8S)
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "politeproxy")
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "politeproxy")
    return deployment, service


def test_k8s_egress_policy_lets_labelled_pods_reach_only_the_proxy_and_dns() -> None:
    docs = load_yaml_docs(K8S_PIPELINES)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    deployment, service = _proxy_side()
    proxy_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container_ports = {
        p["containerPort"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Egress"]  # egress listed: everything not allowed below is denied
    to_proxy, to_dns = spec["egress"]
    (peer,) = to_proxy["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "politeproxy"}
    assert peer["podSelector"]["matchLabels"].items() <= proxy_labels.items()
    assert [(p["protocol"], p["port"]) for p in to_proxy["ports"]] == [("TCP", 3128)]
    assert 3128 in container_ports and service["spec"]["ports"][0]["port"] == 3128
    (dns,) = to_dns["to"]
    assert dns["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert sorted((p["protocol"], p["port"]) for p in to_dns["ports"]) == [("TCP", 53), ("UDP", 53)]
    for rule in spec["egress"]:
        assert all("ipBlock" not in p for p in rule["to"])  # no address range: no way around


def test_k8s_example_pipeline_is_selected_and_points_at_the_proxy_service() -> None:
    docs = load_yaml_docs(K8S_PIPELINES)
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    job = next(d for d in docs if d["kind"] == "Job")
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    _, service = _proxy_side()
    host = f"{service['metadata']['name']}.politeproxy.svc"
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    for var in PROXY_VARS:
        url = urlsplit(env[var])
        assert (url.scheme, url.hostname, url.port) == ("http", host, service["spec"]["ports"][0]["port"])
    assert host in env["NO_PROXY"].split(",")
    assert {env[v] for v in CA_VARS} == {"/tmp/trust-bundle.pem"}
    run = " ".join(container["args"])
    assert f"http://{host}:3128/ca.pem" in run and "/tmp/trust-bundle.pem" in run
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts  # the bundle is written there under a read-only root file system
