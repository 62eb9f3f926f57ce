"""Where a client may go (policy core, no I/O): parse a CONNECT target, route it, check its address.

Pure decisions, tested as tables without sockets. The listener does the I/O in this order:

    target = parse_connect_target(raw)          # Target or Refusal (400): before anything else
    decision = route(target, paced, ports)      # INTERCEPT, TUNNEL or Refusal (403: port, bucket name)
    for each address the tunnel would connect to (resolved once, connected to as checked):
        check_destination(addr, port, where)    # None or Refusal (403: the proxy, private places)
    ip_refusal(target, allow_ip_connect)        # None or Refusal (403: an IP literal, by default)

A Refusal carries the status, a one-line message and the metrics reason.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

from politeproxy.policy.hosts import valid_hostname
from politeproxy.policy.table import default

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

REASONS = {400: "Bad Request", 403: "Forbidden"}
MAX_TARGET = 1024  # no legitimate authority is longer (a name is at most 253 characters)


@dataclass(frozen=True)
class Target:
    """A validated destination: an RFC 1123 name (lower case, no trailing dot) or an IP literal."""

    host: str
    port: int
    ip: Address | None = None

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str  # one line, no newline: client input is shown with repr()
    why: str  # the metrics reason: "bad_request" or "destination"

    @property
    def reason(self) -> str:
        return REASONS.get(self.status, "Forbidden")


class Route(enum.Enum):
    INTERCEPT = "intercept"
    TUNNEL = "tunnel"


@dataclass(frozen=True)
class Where:
    """What the destination check needs to know about the client and the proxy."""

    client_loopback: bool
    allow_private: bool
    own_ports: frozenset[int]


def _show(raw: str) -> str:
    return repr(raw[:100]) + ("..." if len(raw) > 100 else "")


# inet_aton's other spellings of an IPv4 address ("2130706433", "0x7f.1", "0177.0.0.1", "127.1"): the
# system resolver turns them into addresses, so they are refused rather than looked up as names.
_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$")

_IP_CHARS = re.compile(r"[0-9a-fA-F.:]+")  # every IPv4 or IPv6 literal is spelt with these alone


def _bad(raw: str, what: str) -> Refusal:
    return Refusal(400, f"{what}, got {_show(raw)}", "bad_request")


def parse_host(host: str, port: int, raw: str) -> Target | Refusal:
    """A host from client input: an IP literal, or a name of RFC 1123 labels; anything else refused."""
    if "%" in host or not host.isascii():
        return _bad(raw, "CONNECT needs host:port with an ASCII host and no IPv6 zone")
    if _IP_CHARS.fullmatch(host):  # a name with any other character skips two failed parses (every CONNECT)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return Target(str(ip), port, ip)
    name = host.lower()
    name = name[:-1] if name.endswith(".") else name
    if _LEGACY_IPV4.match(name):
        return Refusal(403, f"{_show(host)} is not a dotted-quad IP address", "destination")
    # One label (an intranet name, localhost) is a valid RFC 1123 host too; it is checked like a
    # label of a longer name, and its address is checked after resolution like any other.
    if valid_hostname(name) or ("." not in name and valid_hostname(name + ".invalid")):
        return Target(name, port)
    return _bad(raw, "CONNECT needs host:port with a valid host name")


def _port(text: str) -> int | None:
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        return None
    port = int(text)
    return port if 0 < port < 65536 else None


def split_host_port(raw: str, default_port: int | None = None) -> Target | Refusal:
    """``host:port``, ``[v6]:port`` (and, with ``default_port``, a bare host) into a Target or a Refusal."""
    if not raw or len(raw) > MAX_TARGET:
        return _bad(raw, "CONNECT needs host:port")
    if raw.startswith("["):
        host, close, rest = raw[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            return _bad(raw, "CONNECT needs host:port ([v6]:port for IPv6)")
        port_s, has_port = rest[1:], bool(rest)
        if ":" not in host:
            return _bad(raw, "brackets hold only an IPv6 address")
    else:
        host, sep, port_s = raw.rpartition(":")
        has_port = bool(sep)
        if not sep:
            host = raw
        if ":" in host:
            return _bad(raw, "CONNECT needs host:port, with an IPv6 address in brackets")
    if not has_port and default_port is not None:
        port: int | None = default_port
    else:
        port = _port(port_s) if has_port else None
    if not host or port is None:
        return _bad(raw, "CONNECT needs host:port with a port from 1 to 65535")
    return parse_host(host, port, raw)


def parse_connect_target(raw: str) -> Target | Refusal:
    """The authority-form target of a CONNECT (RFC 9110 9.3.6). Never raises."""
    return split_host_port(raw)


def parse_absolute_target(raw: str) -> tuple[str, Target] | Refusal:
    """The scheme and host of an absolute-form request target (``http://host[:port]/path``)."""
    scheme, sep, rest = raw.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        return _bad(raw, "an absolute http:// URL is needed")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:end]
    if "@" in authority or "\\" in authority:
        return _bad(raw, "a URL without user info is needed")
    target = split_host_port(authority, 443 if scheme == "https" else 80)
    return target if isinstance(target, Refusal) else (scheme, target)


ALLOW_IP_CONNECT: bool = default("allow_ip_connect")  # the key's default (policy/table.py)

# The paced names a client should use instead of a name that reaches Common Crawl's data unpaced.
PACED_EXAMPLES = "data.commoncrawl.org, commoncrawl.s3.amazonaws.com"


def unpaced_bucket_name(host: str) -> bool:
    """A name of the commoncrawl bucket that the paced set does not cover (``commoncrawl.s3-accelerate``
    and its dualstack form, or any other ``commoncrawl.s3*`` endpoint under amazonaws.com): the same
    objects, unpaced. Asked only for names that are not paced."""
    labels = host.split(".")
    return (
        len(labels) >= 4
        and labels[0] == "commoncrawl"
        and labels[1].startswith("s3")
        and labels[-2:] == ["amazonaws", "com"]
    )


def bucket_refusal(host: str, *, paced: bool) -> Refusal | None:
    """The 403 for an unpaced name of the commoncrawl bucket (CONNECT and plain http:// alike)."""
    if paced or not unpaced_bucket_name(host):
        return None
    return Refusal(
        403,
        f"{host} reaches the commoncrawl bucket unpaced: use a paced name ({PACED_EXAMPLES})",
        "destination",
    )


def route(target: Target, *, paced: bool, tunnel_ports: frozenset[int]) -> Route | Refusal:
    """Intercept a paced host, tunnel the rest; only to ports in ``tunnel_ports`` (Squid's SSL_ports).
    An unpaced name of the commoncrawl bucket is refused."""
    if target.port not in tunnel_ports:
        ports = ", ".join(str(p) for p in sorted(tunnel_ports)) or "none"
        return Refusal(
            403, f"CONNECT to port {target.port} is not allowed (tunnel_ports: {ports})", "destination"
        )
    if (bucket := bucket_refusal(target.host, paced=paced)) is not None:
        return bucket
    return Route.INTERCEPT if paced else Route.TUNNEL


def ip_refusal(target: Target, *, allow_ip_connect: bool, connect: bool = True) -> Refusal | None:
    """A CONNECT (or a plain ``http://`` request, ``connect=False``) to an IP literal has no name to pace
    or sign for: refused unless ``allow_ip_connect`` (then the listener checks that no paced name resolves
    to the address). Asked after the destination check, so the proxy itself and private places keep their
    own refusals."""
    if target.ip is None or allow_ip_connect:
        return None
    what, verb = ("CONNECT", "CONNECT") if connect else ("a request", "send it")
    why = (
        f"{what} to an IP address ({target.netloc}) is refused: there is no host name to pace or sign "
        f"for. {verb} to the host name, or set allow_ip_connect = true to allow addresses that no "
        "paced name resolves to"
    )
    return Refusal(403, why, "destination")


def owned_refusal(target: Target, owner: str) -> Refusal:
    """A plain ``http://`` request to an address that the paced name ``owner`` resolves to."""
    why = f"{target.host} is an address of {owner}: a request to it by address is not paced; use the name"
    return Refusal(403, why, "destination")


_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def unmap(addr: Address) -> Address:
    """The IPv4 address inside an IPv4-mapped IPv6 one (``::ffff:127.0.0.1``); else ``addr``."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def check_destination(addr: Address, port: int, where: Where, *, is_local: bool) -> Refusal | None:
    """May a tunnel from this client connect to ``addr:port``? ``is_local``: an address of this host.

    The proxy itself (any local address with its own port) is refused to everyone: nested CONNECTs to
    it would open tunnels without end. Loopback, link-local, unspecified and this host's own addresses
    are refused to non-loopback clients unless ``allow_private_destinations`` is set.
    """
    a = unmap(addr)
    unspecified = a.is_unspecified or a in _THIS_NETWORK  # 0.x.y.z: "this host" to some stacks
    local = is_local or a.is_loopback or unspecified
    if local and port in where.own_ports:
        return Refusal(403, f"{a}:{port} is this proxy", "destination")
    if where.client_loopback or where.allow_private:
        return None
    kind = (
        "a loopback"
        if a.is_loopback
        else "a link-local"
        if a.is_link_local
        else "an unspecified"
        if unspecified
        else "this host's"
        if local
        else None
    )
    if kind is None:
        return None
    return Refusal(403, f"{a} is {kind} address (allow_private_destinations is off)", "destination")
