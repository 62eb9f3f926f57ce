"""The front door's pure decisions (policy/routing.py, issue 25 items 6 and 11): a CONNECT to an IP literal
and the commoncrawl bucket's unpaced names."""

from __future__ import annotations

import ipaddress

import pytest

from politeproxy.policy.hosts import HostSet
from politeproxy.policy.routing import (
    Refusal,
    Route,
    Target,
    bucket_refusal,
    ip_refusal,
    parse_connect_target,
    route,
    unpaced_bucket_name,
)

PORTS = frozenset({443})


@pytest.mark.parametrize("raw", ["127.0.0.1:443", "[::1]:443", "18.160.10.1:443", "[::ffff:1.2.3.4]:443"])
def test_an_ip_literal_is_refused_by_default_naming_the_key(raw: str) -> None:
    target = parse_connect_target(raw)
    assert isinstance(target, Target) and target.ip is not None
    r = ip_refusal(target, allow_ip_connect=False)
    assert isinstance(r, Refusal) and r.status == 403 and r.why == "destination"
    assert "IP address" in r.message and "allow_ip_connect" in r.message and "\n" not in r.message
    assert ip_refusal(target, allow_ip_connect=True) is None


def test_a_name_is_never_an_ip_refusal() -> None:
    assert ip_refusal(Target("data.commoncrawl.org", 443), allow_ip_connect=False) is None
    assert ip_refusal(Target("localhost", 443), allow_ip_connect=False) is None


@pytest.mark.parametrize(
    "host",
    [
        "commoncrawl.s3-accelerate.amazonaws.com",
        "commoncrawl.s3-accelerate.dualstack.amazonaws.com",
        "commoncrawl.s3-object-lambda.us-east-1.amazonaws.com",
    ],
)
def test_unpaced_bucket_names_are_refused_naming_the_paced_ones(host: str) -> None:
    hosts = HostSet()
    assert not hosts.matches(host)  # not paced by default: it would be a blind tunnel
    assert unpaced_bucket_name(host)
    r = route(Target(host, 443), paced=False, tunnel_ports=PORTS)
    assert isinstance(r, Refusal) and r.status == 403
    assert "commoncrawl.s3.amazonaws.com" in r.message and "data.commoncrawl.org" in r.message


@pytest.mark.parametrize(
    "host",
    [
        "commoncrawl.s3.amazonaws.com",
        "commoncrawl.s3.us-east-1.amazonaws.com",
        "commoncrawl.s3-us-west-2.amazonaws.com",
        "commoncrawl.s3.dualstack.us-east-1.amazonaws.com",
    ],
)
def test_paced_bucket_names_are_intercepted(host: str) -> None:
    assert HostSet().matches(host)
    assert route(Target(host, 443), paced=True, tunnel_ports=PORTS) is Route.INTERCEPT
    assert bucket_refusal(host, paced=True) is None


@pytest.mark.parametrize(
    "host", ["other.example", "s3.amazonaws.com", "commoncrawl.example.com", "mybucket.s3.amazonaws.com"]
)
def test_other_names_are_not_the_bucket(host: str) -> None:
    assert not unpaced_bucket_name(host)
    assert route(Target(host, 443), paced=False, tunnel_ports=PORTS) is Route.TUNNEL


def test_the_port_rule_comes_first() -> None:
    r = route(Target("127.0.0.1", 22, ipaddress.ip_address("127.0.0.1")), paced=False, tunnel_ports=PORTS)
    assert isinstance(r, Refusal) and "tunnel_ports" in r.message
