"""The routing table (policy/routing.py) without sockets: CONNECT targets, ports, destinations."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.hosts import valid_hostname
from politeproxy.policy.routing import (
    Refusal,
    Route,
    Target,
    Where,
    check_destination,
    parse_absolute_target,
    parse_connect_target,
    route,
)

OWN = frozenset({3128})
LOOPBACK_CLIENT = Where(client_loopback=True, allow_private=False, own_ports=OWN)
REMOTE_CLIENT = Where(client_loopback=False, allow_private=False, own_ports=OWN)
REMOTE_ALLOWED = Where(client_loopback=False, allow_private=True, own_ports=OWN)


@pytest.mark.parametrize(
    ("raw", "host", "port"),
    [
        ("data.commoncrawl.org:443", "data.commoncrawl.org", 443),
        ("Data.CommonCrawl.ORG.:443", "data.commoncrawl.org", 443),
        ("localhost:443", "localhost", 443),
        ("127.0.0.1:8443", "127.0.0.1", 8443),
        ("[::1]:443", "::1", 443),
        ("[::ffff:127.0.0.1]:443", "::ffff:7f00:1", 443),
        ("a-b.example:65535", "a-b.example", 65535),
    ],
)
def test_valid_connect_targets(raw: str, host: str, port: int) -> None:
    t = parse_connect_target(raw)
    assert isinstance(t, Target), t
    assert (t.host, t.port) == (host, port)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        ("../../x.commoncrawl.org:443", 400),
        ("/etc/x.commoncrawl.org:443", 400),
        ("a..commoncrawl.org:443", 400),
        (".commoncrawl.org:443", 400),
        ("x\x00.commoncrawl.org:443", 400),
        ("x y.commoncrawl.org:443", 400),
        ("-x.commoncrawl.org:443", 400),
        ("x_y.commoncrawl.org:443", 400),
        ("é.commoncrawl.org:443", 400),
        ("data.commoncrawl.org", 400),
        ("data.commoncrawl.org:", 400),
        ("data.commoncrawl.org:0", 400),
        ("data.commoncrawl.org:65536", 400),
        ("data.commoncrawl.org:+443", 400),
        ("data.commoncrawl.org:٤٤٣", 400),  # non-ASCII digits
        (":443", 400),
        ("::1:443", 400),  # IPv6 without brackets
        ("[::1]", 400),
        ("[::1]x:443", 400),
        ("[fe80::1%eth0]:443", 400),
        ("[example.org]:443", 400),
        ("a" * 2000 + ":443", 400),
        ("2130706433:443", 403),  # decimal 127.0.0.1
        ("0x7f.1:443", 403),
        ("0177.0.0.1:443", 403),
        ("127.1:443", 403),
        ("127.000.000.001:443", 403),
    ],
)
def test_refused_connect_targets(raw: str, status: int) -> None:
    r = parse_connect_target(raw)
    assert isinstance(r, Refusal), r
    assert r.status == status
    assert "\n" not in r.message and "\x00" not in r.message
    assert r.why == ("bad_request" if status == 400 else "destination")


def test_absolute_form_targets() -> None:
    assert parse_absolute_target("http://Other.Example/x?y") == ("http", Target("other.example", 80))
    assert parse_absolute_target("https://[::1]:8443/") == (
        "https",
        Target("::1", 8443, ipaddress.ip_address("::1")),
    )
    assert parse_absolute_target("http://a.example:81") == ("http", Target("a.example", 81))
    for bad in (
        "http://../../x.commoncrawl.org/",
        "http://user@127.0.0.1/",
        "http://a.example\\@127.0.0.1/",
        "ftp://a.example/",
        "http:///x",
        "http://a.example:99999/",
        "a.example/x",
    ):
        r = parse_absolute_target(bad)
        assert isinstance(r, Refusal) and r.status == 400, (bad, r)
    r = parse_absolute_target("http://2130706433/")
    assert isinstance(r, Refusal) and r.status == 403


def test_route_by_port_and_pacing() -> None:
    ports = frozenset({443})
    assert route(Target("data.commoncrawl.org", 443), paced=True, tunnel_ports=ports) is Route.INTERCEPT
    assert route(Target("other.example", 443), paced=False, tunnel_ports=ports) is Route.TUNNEL
    for port in (22, 80, 6379, 3128):
        for paced in (True, False):
            r = route(Target("localhost", port), paced=paced, tunnel_ports=ports)
            assert isinstance(r, Refusal) and r.status == 403 and r.why == "destination", r
            assert "tunnel_ports" in r.message
    assert route(Target("x.example", 8443), paced=False, tunnel_ports=frozenset({443, 8443})) is Route.TUNNEL


PRIVATE = [
    "127.0.0.1",
    "127.5.6.7",
    "::1",
    "169.254.169.254",
    "fe80::1",
    "0.0.0.0",
    "0.1.2.3",
    "::",
    "::ffff:127.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:0.0.0.0",
]
PUBLIC = ["93.184.216.34", "2606:2800:220:1::1", "10.1.2.3", "::ffff:93.184.216.34"]


@pytest.mark.parametrize("ip", PRIVATE)
def test_private_destinations_matrix(ip: str) -> None:
    addr = ipaddress.ip_address(ip)
    r = check_destination(addr, 443, REMOTE_CLIENT, is_local=False)
    assert isinstance(r, Refusal) and r.status == 403 and r.why == "destination", r
    assert "allow_private_destinations" in r.message
    assert check_destination(addr, 443, LOOPBACK_CLIENT, is_local=False) is None
    assert check_destination(addr, 443, REMOTE_ALLOWED, is_local=False) is None


@pytest.mark.parametrize("ip", PUBLIC)
def test_public_destinations_pass(ip: str) -> None:
    addr = ipaddress.ip_address(ip)
    for where in (REMOTE_CLIENT, LOOPBACK_CLIENT, REMOTE_ALLOWED):
        assert check_destination(addr, 443, where, is_local=False) is None


def test_own_addresses() -> None:
    me = ipaddress.ip_address("192.0.2.2")  # an address of this host's interface
    r = check_destination(me, 443, REMOTE_CLIENT, is_local=True)
    assert isinstance(r, Refusal) and "this host" in r.message
    assert check_destination(me, 443, LOOPBACK_CLIENT, is_local=True) is None
    # The proxy itself: refused to everyone, whatever allow_private_destinations says.
    for ip, local in (
        ("192.0.2.2", True),
        ("127.0.0.1", False),
        ("0.0.0.0", False),
        ("::ffff:127.0.0.1", False),
    ):
        for where in (REMOTE_CLIENT, LOOPBACK_CLIENT, REMOTE_ALLOWED):
            r = check_destination(ipaddress.ip_address(ip), 3128, where, is_local=local)
            assert isinstance(r, Refusal) and "this proxy" in r.message, (ip, where)
    # Its port on another machine is somebody else's service.
    assert (
        check_destination(ipaddress.ip_address("93.184.216.34"), 3128, REMOTE_CLIENT, is_local=False) is None
    )


@given(st.text(max_size=300))
def test_connect_target_parser_never_raises(raw: str) -> None:
    """Any text gives a Target with a valid host and port, or a one-line 400/403 Refusal."""
    r = parse_connect_target(raw)
    if isinstance(r, Target):
        assert 0 < r.port < 65536
        assert r.ip is not None or valid_hostname(r.host) or valid_hostname(r.host + ".invalid")
        assert "/" not in r.host and "\x00" not in r.host and ".." not in r.host
    else:
        assert r.status in (400, 403) and "\n" not in r.message and len(r.message) < 400


@given(
    st.from_regex(r"\A[a-z0-9.\-\[\]:%/]{0,40}:[0-9+\-]{0,7}\Z"),
)
def test_connect_target_parser_on_near_misses(raw: str) -> None:
    """Targets that look almost right: a Target only for a valid host and a port in 1-65535."""
    r = parse_connect_target(raw)
    if isinstance(r, Target):
        port_text = raw.rpartition(":")[2]
        assert port_text.isdigit() and int(port_text) == r.port and 0 < r.port < 65536
    else:
        assert r.status in (400, 403)


@given(st.text(max_size=200))
def test_absolute_target_parser_never_raises(raw: str) -> None:
    """Any request target gives (scheme, Target) or a Refusal, never an exception."""
    r = parse_absolute_target(raw)
    assert isinstance(r, Refusal) or (r[0] in ("http", "https") and 0 < r[1].port < 65536)


@given(st.ip_addresses(), st.integers(1, 65535), st.booleans(), st.booleans(), st.booleans())
def test_destination_check_is_total(addr, port: int, loop_client: bool, allow: bool, local: bool) -> None:  # type: ignore[no-untyped-def]
    """Every address gives None or a 403; a refusal to a loopback client is always about the proxy itself."""
    where = Where(client_loopback=loop_client, allow_private=allow, own_ports=OWN)
    r = check_destination(addr, port, where, is_local=local)
    if r is not None:
        assert r.status == 403 and r.why == "destination"
        if loop_client or allow:
            assert port in OWN and "this proxy" in r.message
