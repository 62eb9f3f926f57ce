"""``POST /release?host=HOST``: the admin endpoint behind ``politeproxy release`` (issue 24 item 5).

The same door as every admin endpoint (loopback and allowed admin clients, a valid password where
``[auth] users`` admit the client), plus a header a web page cannot send without a CORS preflight
(``X-Politeproxy-Release: 1``), so a page in the operator's browser cannot lift a hold. The host is
checked as a host name; the answer says what was released and what it was held for.
"""

from __future__ import annotations

import hmac
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from politeproxy.observe.admin import Admin, AdminRequest, error_response
from politeproxy.policy.access import basic_credentials
from politeproxy.policy.hosts import normalize_host, valid_hostname
from politeproxy.stores.base import StoreError

log = logging.getLogger("politeproxy.admin")
HEADER = "X-Politeproxy-Release"
Release = Callable[[str, str], Awaitable[dict[str, Any]]]


def who(request: AdminRequest) -> str:
    """Who asked: the client address, and the proxy user name when one was sent (never the password)."""
    creds = basic_credentials(request.headers.get("Proxy-Authorization"))
    user = "".join(ch for ch in creds[0][:64] if ch.isprintable()) if creds else ""
    return f"{user}@{request.remote or '?'}" if user else (request.remote or "?")


def token_ok(token: str, header: str | None) -> bool:
    """Whether ``header`` is ``Bearer <token>`` (compared in constant time); never raises."""
    if not header or len(header) > 4096 or header[:7].lower() != "bearer ":
        return False
    return hmac.compare_digest(header[7:].strip().encode("utf-8", "replace"), token.encode())


class ReleasingAdmin(Admin):
    """The admin endpoints plus ``POST /release``."""

    def __init__(self, *args: Any, release: Release, token: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = release
        self.token = token  # [admin] token_env / token_file: "" = none asked (issue 42, item 4)

    async def handle(self, request: AdminRequest) -> web.Response:
        if request.rel_url.path != "/release":
            return await super().handle(request)
        host_header = request.headers.get("Host")
        if not self.host_check.allows(host_header):  # the DNS-rebinding guard of every admin path
            assert host_header is not None
            return self.host_check.refusal(host_header)
        if request.method != "POST":
            return error_response(405, "/release takes POST (politeproxy release HOST)")
        if request.headers.get(HEADER) != "1":
            return error_response(403, f"/release needs the header {HEADER}: 1 (politeproxy release)")
        if self.token and not token_ok(self.token, request.headers.get("Authorization")):
            log.warning("a release without the admin token from %s refused", who(request))
            return error_response(
                401, "/release needs the admin token ([admin] token_env): politeproxy release sends it",
                {"WWW-Authenticate": 'Bearer realm="politeproxy release"'},
            )  # fmt: skip
        host = normalize_host(request.rel_url.query.get("host", ""))
        if not valid_hostname(host):
            return error_response(400, "/release?host=HOST: HOST must be a host name")
        try:
            answer = await self.release(host, who(request))
        except StoreError as e:
            log.warning("release of %s failed: %s", host, e)
            return error_response(503, f"the schedule store could not be written: {e}")
        refused, wait = answer.get("refused"), answer.get("retry_after") or 0
        if refused:  # 429 (released moments ago, with when to ask again) or 404 (not held)
            if wait > 0:
                return error_response(429, str(refused), {"Retry-After": str(max(1, math.ceil(wait)))})
            return error_response(404, str(refused))
        return web.json_response(answer)
