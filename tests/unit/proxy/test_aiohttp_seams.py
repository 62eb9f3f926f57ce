"""The aiohttp internals politeproxy relies on (proxy/aiohttp_seams.py) are all still there.

Each test names the internal (by its number in the seams module's docstring) and fails with what is gone,
so an aiohttp upgrade that breaks a seam says which, before a proxy misbehaves."""

from __future__ import annotations

import inspect
import re

import aiohttp
import pytest
from aiohttp import client_proto, connector, web

from politeproxy.proxy import aiohttp_seams as seams
from politeproxy.proxy.responses import BoundedHandler, BoundedServer

HANDLER_STATE = ("_force_close", "_close", "_upgraded", "_request_count", "_messages", "_current_request")


def _minor(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    assert found, f"cannot read aiohttp's version {version!r}"
    return int(found[1]), int(found[2])


async def _answer(request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(text="ok")


def test_installed_aiohttp_is_in_the_checked_range() -> None:
    low, high = seams.CHECKED
    got = _minor(aiohttp.__version__)
    assert low <= got <= high, (
        f"aiohttp {aiohttp.__version__} is outside {low[0]}.{low[1]}.x-{high[0]}.{high[1]}.x, the versions "
        "politeproxy/proxy/aiohttp_seams.py was checked against: read each internal its docstring names in "
        "this version's source, run this file and tests/e2e/test_front_limits.py, then widen CHECKED"
    )


async def test_request_handler_private_state_is_there() -> None:
    """1: the head bound reads RequestHandler's private state; a slotted handler keeps no __dict__."""
    server = BoundedServer(_answer, lambda h: None, 1024, lambda c, r: None)
    handler = server()
    assert isinstance(handler, BoundedHandler)
    missing = [name for name in HANDLER_STATE if not hasattr(handler, name)]
    assert not missing, f"aiohttp's RequestHandler no longer has {missing} (aiohttp_seams, internal 1)"
    assert not hasattr(handler, "__dict__"), "RequestHandler lost its __slots__ (aiohttp_seams, internal 1)"
    assert (handler.heads_over(), handler.heads_parsed(), handler.newest_payload(), handler.answering()) == (
        False,
        0,
        None,
        False,
    )
    params = list(inspect.signature(web.RequestHandler.handle_error).parameters)
    assert params[:5] == ["self", "request", "status", "exc", "message"], f"handle_error is now {params}"
    assert callable(getattr(handler, "force_close", None)), "RequestHandler.force_close is gone"


async def test_server_makes_handlers_from_its_private_settings() -> None:
    """2, 3: calling the server makes a handler from _loop and _kwargs; handler_cancellation stays with
    the server (a RequestHandler given it would fail to build)."""
    assert "handler_cancellation" in inspect.signature(web.Server).parameters, (
        "web.Server: no handler_cancellation"
    )
    server = seams.ServerSeam(_answer, handler_cancellation=True, keepalive_timeout=5.0, access_log=None)
    for name in ("_loop", "_kwargs"):
        assert hasattr(server, name), f"web.Server no longer has {name} (aiohttp_seams, internal 2)"
    settings = server.handler_settings()
    assert "handler_cancellation" not in settings, "web.Server now hands handler_cancellation to its handlers"
    assert server.handler_cancellation is True
    assert settings["keepalive_timeout"] == 5.0
    assert isinstance(seams.HandlerSeam(server, **settings), web.RequestHandler)
    assert inspect.signature(web.Server.connection_lost).parameters.keys() >= {"handler", "exc"}


def test_request_handler_takes_every_setting_the_listener_passes() -> None:
    """4: every key of HandlerSettings is a RequestHandler parameter (access_log=None among them)."""
    params = inspect.signature(web.RequestHandler).parameters
    unknown = sorted(seams.HandlerSettings.__optional_keys__ - params.keys())
    assert not unknown, f"RequestHandler no longer takes {unknown} (aiohttp_seams, internal 4)"


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        (web.BaseRequest, "writer"),  # 7
        (aiohttp.ClientResponse, "connection"),  # 8
        (connector.Connection, "protocol"),  # 8
        (connector.Connection, "transport"),  # 8
        (client_proto.ResponseHandler, "closed"),  # 8
        (client_proto.ResponseHandler, "eof_received"),  # 8
        (web.RequestHandler, "data_received"),  # 1, 5
        (web.RequestHandler, "connection_made"),  # 5
        (aiohttp.TCPConnector, "_get"),  # 9
        (client_proto.ResponseHandler, "should_close"),  # 9
    ],
)
def test_attribute_is_there(owner: type, name: str) -> None:
    assert hasattr(owner, name), f"aiohttp's {owner.__qualname__}.{name} is gone (aiohttp_seams)"


def test_processing_error_carries_code_and_message() -> None:
    """6: what aiohttp raises and logs for a malformed request."""
    e = seams.HttpProcessingError(code=400, message="bad head")
    assert (e.code, e.message) == (400, "bad head")
