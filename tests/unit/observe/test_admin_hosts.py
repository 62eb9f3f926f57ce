"""Which Host values the admin paths answer (observe/admin.py HostCheck, issue 25 item 8): a table of
client-chosen header values, none of which may raise."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.observe.admin import ADMIN_HOSTS, HostCheck

CHECK = HostCheck(ADMIN_HOSTS, listen="proxy.internal.example")


@pytest.mark.parametrize(
    "host",
    [
        None,  # HTTP/1.0 without Host: no browser sends that
        "127.0.0.1",
        "127.0.0.1:3128",
        "[::1]:3128",
        "10.1.2.3:3128",  # any IP literal: rebinding needs a name
        "localhost",
        "LOCALHOST.:3128",
        "status.localhost:3128",
        "politeproxy:3128",  # deploy/prometheus.yml's target
        "politeproxy.politeproxy.svc:3128",
        "proxy.internal.example:3128",  # the listen address
        socket.gethostname(),
    ],
)
def test_names_of_this_proxy_are_answered(host: str | None) -> None:
    assert CHECK.allows(host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:3128",
        "politeproxy.evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "0x7f.1",  # another spelling of 127.0.0.1, which a resolver would take
        "[fe80::1%eth0]",
        "",
        "a b",
        "evil.example\r\nX: y",
    ],
)
def test_other_names_are_refused(host: str) -> None:
    assert not CHECK.allows(host)


def test_admin_hosts_can_name_others() -> None:
    check = HostCheck(["Status.Example.ORG."])
    assert check.allows("status.example.org:443") and not check.allows("politeproxy")


@given(st.text(max_size=300))
def test_any_header_never_raises(host: str) -> None:
    assert CHECK.allows(host) in (True, False)
