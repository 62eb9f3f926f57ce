"""The deploy files that run replicas give them one egress name (issue 24 item 1): replicas behind one NAT
are one IP to Common Crawl, so they must share one request window. Each container's own host name (its id,
the default) would give every replica a window of its own."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.support.deploy import COMPOSE, K8S, load_yaml_docs

yaml = pytest.importorskip("yaml")  # optional: the deploy files are YAML


def _applied(name: str, toml_text: str, egress: str) -> str:
    """The egress name the proxy ends up with, given the deploy file's config and its env override."""
    from politeproxy.config import loading as proxy_config

    overrides = proxy_config.env_overrides({"POLITEPROXY_EGRESS_NAME": egress})
    return proxy_config.build(tomllib.loads(toml_text), name, overrides).egress_name


def test_compose_replicas_share_one_egress_name() -> None:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    value = compose["services"]["politeproxy"]["environment"]["POLITEPROXY_EGRESS_NAME"]
    default = re.fullmatch(r"\$\{POLITEPROXY_EGRESS_NAME:-([^}]+)\}", value)
    assert default, value  # a fixed default the operator may override from deploy/.env
    config = (COMPOSE.parent / "politeproxy.toml").read_text(encoding="utf-8")
    assert _applied("politeproxy.toml", config, default.group(1)) == default.group(1)


def test_k8s_replicas_share_one_egress_name() -> None:
    docs = load_yaml_docs(K8S)
    proxy = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "politeproxy")
    assert proxy["spec"]["replicas"] > 1
    env = {e["name"]: e.get("value") for e in proxy["spec"]["template"]["spec"]["containers"][0]["env"]}
    name = env.get("POLITEPROXY_EGRESS_NAME")
    assert name, "every replica would count under its pod's host name"
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["politeproxy.toml"]
    assert _applied("k8s.yaml:politeproxy.toml", config, name) == name
