"""A plain ``http://`` request on the proxy port, which aiohttp's low-level server parsed, as a
``ClientSide``: the exchange code writes to it; ``response`` is what the aiohttp handler returns.

Plain forwarding stays on aiohttp (the intercepted tunnels, where the traffic is, have their own protocol,
h1server.py): moving it would gain nothing measurable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from politeproxy.proxy.aiohttp_seams import HttpProcessingError, write_early
from politeproxy.proxy.clientside import ClientGone, Own
from politeproxy.proxy.passage import add_via
from politeproxy.proxy.responses import error_response

CHUNK = 256 * 1024  # as upstream.CHUNK: one read of a request body


class _Relayed(web.StreamResponse):
    """Sends the head with the first body chunk: one send for a small answer."""

    _send_headers_immediately = False


class PlainSide:
    """The client side of one aiohttp request."""

    __slots__ = ("request", "method", "target", "version", "remote", "headers", "has_body", "response")

    def __init__(self, request: web.BaseRequest) -> None:
        self.request = request
        self.method = request.method
        self.target = request.raw_path
        self.version: tuple[int, int] = (request.version.major, request.version.minor)
        self.remote = request.remote or "?"
        self.headers: CIMultiDict[str] = CIMultiDict(request.headers)
        self.has_body = request.body_exists
        self.response: web.StreamResponse | None = None

    async def body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.request.content.iter_chunked(CHUNK):
                yield chunk
        except (OSError, aiohttp.ClientError, HttpProcessingError) as e:
            raise ClientGone(f"the request body broke: {e}") from e

    async def interim(self, data: bytes) -> None:
        await write_early(self.request, data)

    def start(self, status: int, reason: str | None, headers: CIMultiDict[str]) -> None:
        self.response = _Relayed(status=status, reason=reason, headers=headers)

    async def _prepared(self) -> web.StreamResponse:
        resp = self.response
        assert resp is not None, "start() comes first"
        if not resp.prepared:
            await resp.prepare(self.request)
        return resp

    async def write(self, chunk: bytes) -> None:
        try:
            await (await self._prepared()).write(chunk)
        except aiohttp.ClientError as e:
            raise ClientGone(str(e)) from e

    async def end(self) -> None:
        try:
            await (await self._prepared()).write_eof()
        except aiohttp.ClientError as e:
            raise ClientGone(str(e)) from e

    def abort(self) -> None:
        if self.request.transport is not None:
            self.request.transport.abort()

    async def answer(self, own: Own) -> None:
        resp = web.Response(status=own.status, body=own.body, headers=own.head())
        add_via(resp.headers)
        if own.close:
            resp.force_close()
        self.response = resp  # aiohttp sends it when the handler returns

    def finished(self) -> web.StreamResponse:
        """What the aiohttp handler returns: the answer written, else (never expected) a 500."""
        if self.response is None:
            return error_response(500, "no answer was made")
        return self.response
