"""The aiohttp client internals the upstream side still relies on (proxy/aiohttp_seams.py) are all there.

Each test names the internal (by its number in the seams module's docstring) and fails with what is gone,
so an aiohttp upgrade that breaks a seam says which, before a proxy misbehaves. (The server side has no
seam left: the proxy's own protocol reads every client byte.)"""

from __future__ import annotations

import re

import aiohttp
import pytest
from aiohttp import client_proto, connector

from politeproxy.proxy import aiohttp_seams as seams


def _minor(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    assert found, f"cannot read aiohttp's version {version!r}"
    return int(found[1]), int(found[2])


def test_installed_aiohttp_is_in_the_checked_range() -> None:
    low, high = seams.CHECKED
    got = _minor(aiohttp.__version__)
    assert low <= got <= high, (
        f"aiohttp {aiohttp.__version__} is outside {low[0]}.{low[1]}.x-{high[0]}.{high[1]}.x, the versions "
        "politeproxy/proxy/aiohttp_seams.py was checked against: read each internal its docstring names in "
        "this version's source, run this file, then widen CHECKED"
    )


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (aiohttp.ClientResponse, "connection"),  # 8
        (connector.Connection, "protocol"),  # 8
        (connector.Connection, "transport"),  # 8
        (client_proto.ResponseHandler, "closed"),  # 8
        (client_proto.ResponseHandler, "eof_received"),  # 8
        (aiohttp.TCPConnector, "_get"),  # 9
        (client_proto.ResponseHandler, "should_close"),  # 9
    ],
)
def test_attribute_is_there(owner: type, name: str) -> None:
    assert hasattr(owner, name), f"aiohttp's {owner.__qualname__}.{name} is gone (aiohttp_seams)"
