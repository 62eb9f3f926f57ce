"""Request forms a Common Crawl service refuses by itself, answered locally (issue 42, item 1; no I/O).

CloudFront answers a method its distribution does not allow with its own 403 ("Invalid method"), and a GET
(or HEAD) that carries a body with another (CloudFront Developer Guide). data.commoncrawl.org and
index.commoncrawl.org take GET and HEAD only. Such a request is useless upstream, spends a slot and a
count in the window, and its 403 looks like the WAF's block: one client could hold the host for every
pipeline. So the proxy answers it itself, before the cache and the pacer: 405 with ``Allow`` for the
method, 400 for the body.

The public bucket (``s3://commoncrawl``, under every name) grants everyone reads only: S3 refuses a write
(PUT, DELETE, PATCH) from anyone but the bucket's owner with 403 AccessDenied, so the proxy answers it the
same way; methods S3 does not know at all get 405. Reads pass, and so do OPTIONS (a CORS preflight, answered
by S3) and POST (S3 Select is a read: it needs only ``s3:GetObject``).

Any other host (the web site, a name a user added to the paced hosts) is passed on as it came: its rules
are not known here.
"""

from __future__ import annotations

from dataclasses import dataclass

from politeproxy.policy.services import BUCKET, DATA, INDEX, SERVICE_HOST, service_of

CLOUDFRONT_METHODS: tuple[str, ...] = ("GET", "HEAD")  # what data and index take (their distribution's)
BUCKET_METHODS: tuple[str, ...] = ("GET", "HEAD", "OPTIONS", "POST")  # passed on to the public bucket
BUCKET_WRITES: frozenset[str] = frozenset({"PUT", "DELETE", "PATCH"})  # S3 denies them to everyone else
_CLOUDFRONT_SERVICES = frozenset({DATA, INDEX})


@dataclass(frozen=True, slots=True)
class FormRefusal:
    """The local answer to a request of a form the service refuses: status, message, ``Allow`` ("" none)."""

    status: int
    message: str
    allow: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Allow": self.allow} if self.allow else {}


def cloudfront_refuses(method: str, has_body: bool) -> bool:
    """Whether CloudFront itself refuses a request of this form to data or index (its own 403, which is
    that request's answer, never the WAF's block)."""
    return method not in CLOUDFRONT_METHODS or has_body  # methods are case-sensitive (RFC 9110 9.1)


def refused_form(host: str, path: str, method: str, has_body: bool) -> FormRefusal | None:
    """The local answer to a paced request of a form ``host``'s service refuses by itself; None when the
    request may go. ``path`` matters only for the bucket's path-style names. Never raises."""
    if not has_body and method in CLOUDFRONT_METHODS:  # nearly every request: no service lookup
        return None
    service = service_of(host, path)
    meth = method if isinstance(method, str) else ""  # case-sensitive: "get" is not GET (RFC 9110 9.1)
    if service in _CLOUDFRONT_SERVICES:
        name = SERVICE_HOST[service]
        if meth not in CLOUDFRONT_METHODS:
            allow = ", ".join(CLOUDFRONT_METHODS)
            return FormRefusal(
                405, f"{name} takes only {allow}; CloudFront refuses {_shown(meth)} by itself", allow
            )
        if has_body:
            return FormRefusal(
                400, f"a {meth} with a request body: CloudFront refuses it by itself (send it without one)"
            )
        return None
    if service == BUCKET:
        if meth in BUCKET_METHODS:
            return None
        if meth in BUCKET_WRITES:
            return FormRefusal(
                403, f"the commoncrawl bucket is read-only for everyone but its owner: S3 denies {meth}"
            )
        allow = ", ".join(BUCKET_METHODS)
        return FormRefusal(405, f"S3 does not take {_shown(meth)}", allow)
    return None


def _shown(method: str) -> str:
    """A method for the message: printable, bounded (it came from the client)."""
    text = "".join(c if c.isprintable() else "?" for c in method[:24])
    return text or "an empty method"
