"""Who may use the proxy (policy core, no I/O): loopback by default; CIDRs and/or Basic proxy auth."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Callable, Iterable, Mapping

from politeproxy.policy.fairness import clean_name


def _address(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of a peer name, without an IPv6 zone; None when it is not an address.

    An IPv4-mapped IPv6 peer (``::ffff:10.1.2.3``, what a dual-stack listener on ``::`` reports for an
    IPv4 client) is its IPv4 address, so IPv4 CIDRs and the loopback rule match it.
    """
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def is_loopback(ip: str) -> bool:
    addr = _address(ip)
    return addr is not None and addr.is_loopback


class Access:
    """Who may use the proxy: loopback only by default; CIDRs and/or Basic proxy authentication."""

    def __init__(
        self,
        allow_clients: Iterable[str],
        users: Mapping[str, str],
        tokens: dict[str, str] | None = None,
        on_guest: Callable[[str, str], None] = lambda _name, _client: None,
        admin_token: str = "",
    ) -> None:
        self.networks = [ipaddress.ip_network(c, strict=False) for c in allow_clients]
        self.users = users
        self.tokens = tokens or {}  # pipeline -> its secret ([pipelines.NAME] token_env / token_file)
        self.on_guest = on_guest  # told (name, client) of each request naming a pipeline without its token
        self.admin_token = admin_token  # what POST /release must carry as a Bearer token ("": none asked)

    @property
    def open_beyond_loopback(self) -> bool:
        return bool(self.networks or self.users)

    def ip_allowed(self, ip: str) -> bool:
        if is_loopback(ip):
            return True
        if self.networks:
            addr = _address(ip)
            return addr is not None and any(addr in n for n in self.networks)
        return bool(self.users)

    def admin_allowed(self, ip: str, header: str | None) -> bool:
        """The admin endpoints: loopback and ``allow_clients`` by address; a client let in only because
        ``[auth] users`` are set must show a valid password too (else anyone could read /metrics)."""
        if is_loopback(ip):
            return True
        if self.networks:
            addr = _address(ip)
            if addr is not None and any(addr in n for n in self.networks):
                return True
        return bool(self.users) and self.auth_ok(header)

    def auth_ok(self, header: str | None) -> bool:
        if not self.users:
            return True
        creds = basic_credentials(header)
        if creds is None:
            return False
        user, password = creds
        want = self.users.get(user)
        return want is not None and hmac.compare_digest(want.encode(), password.encode())

    def look_alike(self, header: str | None) -> str | None:
        """Why a request is refused (407) when its user name is counted as a pipeline with a token but is
        not that name as sent ("url fetch", "url\\x01fetch", a 65-character name: all counted as
        ``url_fetch``); None otherwise. Tokens are checked on the name as it will be counted (issue 42,
        item 3): checked on the raw name, any look-alike took the protected pipeline's share unchecked."""
        if not self.tokens or self.users:  # [auth] users come first: their names are checked exactly
            return None
        creds = basic_credentials(header)
        if creds is None or not creds[0]:
            return None
        counted = clean_name(creds[0])
        if counted == creds[0] or counted not in self.tokens:
            return None
        return (
            f"the proxy user name is counted as pipeline {counted}, which needs its token: "
            f"send the name exactly as configured ([pipelines.{counted}] token_env or token_file)"
        )

    def pipeline(self, header: str | None, client: str | None) -> str:
        """Who is asking: the Basic user name (without ``[auth] users`` any name, with any or no password,
        names a pipeline and grants nothing; with users set, auth_ok has checked it), else the client's
        address. The pacer maps it to a bounded name."""
        creds = basic_credentials(header)
        if creds is not None and creds[0]:
            name, password = creds
            token = self.tokens.get(name) if not self.users else None  # [auth] users come first
            if token is not None and not hmac.compare_digest(token.encode(), password.encode()):
                self.on_guest(name, client or "unknown")
                return name[: MAX_NAME - len(GUEST)] + GUEST  # a share of its own, weight 1
            return name
        return client or "unknown"


GUEST = "~guest"  # the pipeline of a request that named a pipeline with a token, without the token
MAX_NAME = 64  # policy.fairness.MAX_NAME: the guest name stays within it
MAX_AUTH_HEADER = 4096  # a longer Proxy-Authorization is no credential (the head is bounded anyway)


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) of a ``Proxy-Authorization: Basic`` value; None when absent or malformed. Never
    raises, whatever the bytes."""
    if not header or len(header) > MAX_AUTH_HEADER or header[:6].lower() != "basic ":
        return None
    try:
        user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return user, password
