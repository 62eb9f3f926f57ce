"""The server name (SNI) a TLS client asks for, read from the first bytes of a tunnel.

No hand-written TLS parser: the bytes go into an ``ssl.SSLObject`` over a ``MemoryBIO`` in server mode
(CPython's ssl, that is OpenSSL, parses the ClientHello), and an ``sni_callback`` records the name, then
ends the handshake with an alert that is never sent. The caller only reads; it never answers.

    peeked = server_name(first_bytes)   # Peeked(done, name): done=False means "send me more bytes"
"""

from __future__ import annotations

import ssl
import sys
import threading
from dataclasses import dataclass
from typing import Any

from politeproxy.policy.hosts import normalize_host, valid_hostname

MAX_HELLO = 32 * 1024  # a ClientHello with post-quantum key shares is ~2 KiB; more is not a hello
TLS_HANDSHAKE = 0x16  # the content type of a TLS handshake record: every ClientHello starts with it


@dataclass(frozen=True)
class Peeked:
    done: bool  # False: the bytes so far are the start of a ClientHello, more may name a server
    name: str | None = None  # the server name, normalised and a valid host name; None if none


MORE = Peeked(False)
NONE = Peeked(True)

_local = threading.local()


def _record(obj: Any, name: str | None, _ctx: ssl.SSLContext) -> int:
    obj.politeproxy_sni = name
    return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME  # stop here: no key exchange for a peek


def _quiet_hook(previous: Any) -> Any:
    """CPython reports a server name that is not ASCII as an "Exception ignored" on stderr: a client
    could fill the log with them. While this thread peeks, such a report only means "no name"."""

    def hook(args: Any) -> None:
        if getattr(_local, "peeking", False) and isinstance(args.exc_value, UnicodeError):
            return
        previous(args)

    hook.politeproxy = True  # type: ignore[attr-defined]
    return hook


def _context() -> ssl.SSLContext:
    ctx: ssl.SSLContext | None = getattr(_context, "ctx", None)
    if ctx is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # The version check runs before the name callback: accept any hello OpenSSL can still read, so
        # an old client naming a paced host is intercepted (and then fails there), not tunnelled.
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        try:
            ctx.set_ciphers("ALL:@SECLEVEL=0")
        except ssl.SSLError:  # pragma: no cover - an OpenSSL without security levels
            pass
        ctx.sni_callback = _record
        _context.ctx = ctx  # type: ignore[attr-defined]
        if not getattr(sys.unraisablehook, "politeproxy", False):
            sys.unraisablehook = _quiet_hook(sys.unraisablehook)
    return ctx


def server_name(data: bytes | bytearray | memoryview, limit: int = MAX_HELLO) -> Peeked:
    """What the first ``data`` bytes of a tunnel say about the server the client wants. Never raises.

    ``MORE`` while they are an incomplete ClientHello (under ``limit`` bytes); else done, with the
    server name when the ClientHello carries a valid one. Not TLS, no SNI, a malformed or oversized
    hello: done without a name (the tunnel stays blind)."""
    if not isinstance(data, bytes | bytearray | memoryview) or not data:
        return MORE if isinstance(data, bytes | bytearray | memoryview) else NONE
    if data[0] != TLS_HANDSHAKE or len(data) > limit:
        return NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj: ssl.SSLObject | None = None
    _local.peeking = True
    try:
        obj = _context().wrap_bio(incoming, outgoing, server_side=True)
        incoming.write(bytes(data))
        obj.do_handshake()
    except ssl.SSLWantReadError:
        return MORE
    except Exception:  # noqa: BLE001, S110 - every failure of a client's bytes means "no name"
        pass
    finally:
        _local.peeking = False
    raw = getattr(obj, "politeproxy_sni", None)
    name = normalize_host(raw) if isinstance(raw, str) else ""
    return Peeked(True, name) if valid_hostname(name) else NONE
