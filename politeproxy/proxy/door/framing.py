"""The framing rules of a client's HTTP/1.1 requests (RFC 9112), decided in one place for every byte a client
sends: the proxy port's first head, its plain ``http://`` requests and the requests inside intercepted
tunnels are read by one protocol (h1base.py) and judged here.

llhttp (through httptools) parses, strictly, and refuses by itself (a 400, then the connection closes):

- Content-Length beside Transfer-Encoding (section 6.1: a request-smuggling vector), a repeated
  Content-Length, or one that is not all digits (6.3);
- a Transfer-Encoding whose last coding is not chunked (6.3, item 4), or chunked named twice;
- obs-fold (a field line that starts with whitespace, 5.2) and whitespace before a field's colon (5.1);
- a bare LF where CRLF belongs, in the head and in the chunked framing (2.2);
- a chunk size that is not hex, or followed by whitespace (7.1); chunk extensions are parsed and dropped;
- a method llhttp does not know, a name that is not a token, a control character in a value.

What the parser leaves to its user is decided here, once a head is complete (``refusal``):

- exactly one Host in an HTTP/1.1 request, at most one in HTTP/1.0 (3.2);
- HTTP/1.0 and HTTP/1.1 only (505 otherwise: a 0.9 or 2.0 request line);
- Transfer-Encoding: chunked alone; any other coding is 501, as the proxy decodes none (6.1);
- Transfer-Encoding in an HTTP/1.0 request is faulty framing (6.1): refused.

And while reading: trailer fields are dropped, never merged into a head that went upstream (7.1.2); a field
value's trailing whitespace is trimmed (5.5: llhttp trims only the leading); a head is bounded by
``max_header_size`` across reads. tests/unit/proxy/test_framing.py holds every accepted request against a
reference parser (the tests' own): where this proxy reads a request, it reads the same one, ending at the
same byte.
"""

from __future__ import annotations

from multidict import CIMultiDict

LINE_EXTRA = 12  # a request line's bytes besides its method and target: " ", " HTTP/1.1", CRLF
FIELD_EXTRA = 4  # a field line's bytes besides its name and value: ": ", CRLF
VERSIONS = frozenset({"1.0", "1.1"})
OWS = b" \t"  # optional whitespace, trimmed from the end of a field value (h1server.on_header)


def refusal(version: str, headers: CIMultiDict[str]) -> tuple[int, str] | None:
    """The refusal of a complete request head llhttp accepted: (status, why), or None when it may go on."""
    if version not in VERSIONS:
        return 505, f"HTTP/{version} is not served here: HTTP/1.1 or HTTP/1.0 only"
    hosts = len(headers.getall("Host", ()))
    if hosts > 1 or hosts == 0 and version == "1.1":
        return 400, "a request head needs exactly one Host field"
    te = headers.getall("Transfer-Encoding", None)
    if te is not None:
        if version == "1.0":
            return 400, "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 section 6.1)"
        if ",".join(te).strip().lower() != "chunked":
            return 501, "only Transfer-Encoding: chunked is read here"
    return None
