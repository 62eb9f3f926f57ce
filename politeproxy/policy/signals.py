"""What an upstream answer says, read by its cause (issue 24, item 4; policy core, no I/O).

A 403 means different things depending on who made it. CloudFront's own 403 (``Server: CloudFront``, the
WAF's "Request blocked" page) is a block of this machine: hold the host, then one probe. S3's 403
(``Server: AmazonS3``, an XML ``<Code>AccessDenied</Code>`` body: most often an unsigned request, since S3
requires signed ones) answers that one request and says nothing about load. CloudFront adds
``X-Cache: Error from cloudfront`` to an origin's error too, so that header alone proves nothing. A 403
that fits neither is held as a block, as before. A 404 is never a throttle. CloudFront also answers its
own 403 to a request of a form it refuses by itself (a method its distribution does not allow, a GET with a
body; issue 42): such a 403 is that request's answer (``Cause.FORM``), never a block, whatever its page says.

Decided from the head (status, Server, Content-Type) and, for a 403 with an XML or HTML body, at most
``PEEK`` bytes of the body's start. Never raises, whatever the upstream sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

PEEK = 512  # bytes of a 403's body read to find who made it; the rest streams on untouched
_SERVER_MAX = 64  # characters of a Server header kept for logs and /status


class Cause(Enum):
    """Who made the answer, as far as it tells the pacer anything."""

    STATUS = "status"  # not a 403: the status code decides (throttle codes, block codes, or nothing)
    CLOUDFRONT = "cloudfront"  # CloudFront / its WAF refused this machine: a block
    S3_DENIED = "s3_denied"  # S3 refused this one request: no hold, no backoff
    FORM = "form"  # CloudFront refused this request's form (method, body): that request's answer only
    UNKNOWN_403 = "unknown_403"  # a 403 from neither: a block, as before, logged once with its headers
    NOT_FOUND = "not_found"  # 404: an ordinary answer, never a throttle
    LOCAL = "local"  # the proxy's own failure (TLS trust, DNS, refused, pool): nothing about the upstream

    @property
    def records(self) -> bool:
        """Whether this answer may count as a throttle or block at all (an S3 denial or a 404 came
        through: the pacer reads it as any success; a local failure never reaches it)."""
        return self not in (Cause.S3_DENIED, Cause.FORM, Cause.NOT_FOUND, Cause.LOCAL)


@dataclass(frozen=True, slots=True)
class Signal:
    """The cause of one answer, and the Server that sent it (printable, bounded) for logs and /status."""

    cause: Cause
    server: str = ""

    def reason(self, status: int | None) -> str:
        """ "403 from CloudFront" and the like: why a host is held, for the operator."""
        who = {
            Cause.CLOUDFRONT: "CloudFront",
            Cause.S3_DENIED: "S3",
            Cause.FORM: "CloudFront (the request's form)",
            Cause.UNKNOWN_403: "an unknown server",
        }.get(self.cause)
        what = str(status) if status is not None else "no answer"
        if who is None:
            return f"{what} from upstream" + (f" (Server: {self.server})" if self.server else "")
        return f"{what} from {who}" + (f" (Server: {self.server})" if self.server else "")


def _server(headers: Mapping[str, str]) -> str:
    try:
        raw = headers.get("Server") or ""
    except Exception:  # noqa: BLE001 - a broken mapping reads as no Server at all
        return ""
    if not isinstance(raw, str):
        return ""
    return "".join(c if c.isprintable() else "?" for c in raw.strip()[:_SERVER_MAX])


def _content_type(headers: Mapping[str, str]) -> str:
    try:
        raw = headers.get("Content-Type") or ""
    except Exception:  # noqa: BLE001
        return ""
    return raw.split(";", 1)[0].strip().lower() if isinstance(raw, str) else ""


def wants_body(status: int | None, headers: Mapping[str, str]) -> bool:
    """Whether the first ``PEEK`` bytes of the body would help: a 403 whose Server does not already say."""
    if status != 403:
        return False
    server = _server(headers).lower()
    if server.startswith("amazons3"):
        return False
    ct = _content_type(headers)
    return "xml" in ct or "html" in ct or not ct


def read_signal(
    status: int | None, headers: Mapping[str, str], head: bytes = b"", *, odd_form: bool = False
) -> Signal:
    """The cause of an answer with ``status`` and ``headers``; ``head``: at most the first ``PEEK`` bytes
    of its body (only a 403's is ever asked for; ``wants_body``). ``odd_form``: the request was of a form
    CloudFront refuses by itself (``policy.forms.cloudfront_refuses``)."""
    if status != 403:  # every answer passes here: no header is read for the others (the hot path)
        return _NOT_FOUND if status == 404 else _STATUS
    server = _server(headers)
    low = server.lower()
    if low.startswith("amazons3"):
        return Signal(Cause.S3_DENIED, server)
    text = bytes(head[:PEEK]).decode("latin-1").lower() if isinstance(head, bytes | bytearray) else ""
    # S3's XML error, also when CloudFront passed it on (and perhaps replaced the Server header)
    if "<error>" in text and "<code>accessdenied</code>" in text:
        return Signal(Cause.S3_DENIED, server)
    if low.startswith("cloudfront") or "request blocked" in text:
        return Signal(Cause.FORM if odd_form else Cause.CLOUDFRONT, server)
    return Signal(Cause.UNKNOWN_403, server)


_STATUS = Signal(Cause.STATUS)
_NOT_FOUND = Signal(Cause.NOT_FOUND)
LOCAL = Signal(Cause.LOCAL)
