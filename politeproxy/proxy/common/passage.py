"""Proof of passage: the response headers that show a tool's request went through the proxy.

Every answer to a request the proxy serves (relayed, or its own error answer) carries ``Via: 1.1
politeproxy`` (RFC 9110 7.6.3: appended after the upstream's own Via entries, never replacing them). An
answer that went through the pacer also says how long it was held and which pipeline it counted as.
These are response headers only: a request's (possibly signed) headers are never touched here.
"""

from __future__ import annotations

import math

from multidict import CIMultiDict

VIA_ENTRY = "1.1 politeproxy"
WAIT_HEADER = "X-Politeproxy-Wait"  # seconds the proxy held the request before it went upstream, "0.412"
PIPELINE_HEADER = "X-Politeproxy-Pipeline"  # the (bounded, cleaned) pipeline name it counted as
MAX_VIA = 4096  # an upstream Via longer than this is cut (the whole head is bounded: h1answer.MAX_HEAD)


def add_via(headers: CIMultiDict[str]) -> None:
    """Append our entry to the Via field: one field line, the upstream's entries first, in order."""
    if "Via" not in headers:  # the usual answer: nothing to keep in front of ours
        headers["Via"] = VIA_ENTRY
        return
    prior = [v.strip() for v in headers.popall("Via", []) if v.strip()]
    text = ", ".join(prior)
    if len(text) > MAX_VIA:
        text = text[:MAX_VIA].rsplit(",", 1)[0]
    headers["Via"] = f"{text}, {VIA_ENTRY}" if text else VIA_ENTRY


def wait_text(seconds: float) -> str:
    """Seconds held, three decimals; a non-finite or negative value (never expected) reads as 0."""
    if not math.isfinite(seconds) or seconds < 0:
        seconds = 0.0
    return f"{seconds:.3f}"


def held(headers: CIMultiDict[str], wait: float | None, pipeline: str | None) -> None:
    """The wait and the pipeline, each when given. ``pipeline`` must already be a cleaned name
    (``Pacer.pipeline``: printable ASCII without spaces or quotes), so it is safe in a header."""
    if wait is not None:
        headers[WAIT_HEADER] = wait_text(wait)
    if pipeline:
        headers[PIPELINE_HEADER] = pipeline


def stamp(headers: CIMultiDict[str], wait: float | None = None, pipeline: str | None = None) -> None:
    """Mark an answer as having passed: Via always; the wait and the pipeline when given (paced and exempt
    answers; a cache hit may name the pipeline with ``wait=0.0``)."""
    add_via(headers)
    held(headers, wait, pipeline)
