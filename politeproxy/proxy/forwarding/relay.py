"""Streams an upstream answer back to the client, with the proxy's passage headers.

A close-delimited body goes out chunked to HTTP/1.1 clients (both client sides frame a length-less
answer so), so a cut can be passed on as a cut: the client connection is aborted before the last chunk.
An HTTP/1.0 client gets it close-delimited and cannot see a cut. Never reads a whole body: one CHUNK
at a time.
"""

from __future__ import annotations

import logging

from politeproxy.policy.backoff import retry_after_seconds
from politeproxy.proxy.common.clientside import ClientSide
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.proxy.common.exchange import Exchange
from politeproxy.proxy.common.passage import stamp
from politeproxy.proxy.forwarding.speak import standard_fields
from politeproxy.proxy.origin.upstream import CHUNK, Answer, loggable, strip_hop_by_hop

log = logging.getLogger("politeproxy")
RETRY_AFTER_STATUSES = frozenset({403, 429, 503})  # answers that always carry a Retry-After (issue 12)


async def relay(client: ClientSide, upstream: Answer, ex: Exchange, events: ProxyEvents) -> None:
    """Stream the answer back; ``ex`` (the forwarder's) gets the bytes and a note on a cut or a leave.

    ``ex.held``: the request went through the pacer, so the answer names its wait and pipeline."""
    headers = strip_hop_by_hop(upstream.headers)
    if _throttle_passed_on(upstream.status, ex) and "Retry-After" not in headers:
        # A throttle or block passed on carries a Retry-After even when upstream gave none (issue 12):
        # duckdb and friends retry within 0.5 s otherwise. The pacer's delay, else one second.
        headers["Retry-After"] = str(retry_after_seconds(ex.retry_after or 1.0))
    if ex.held:
        stamp(headers, ex.wait, ex.pipeline)
    else:
        stamp(headers)  # Via only
    tee = ex.tee  # proxy/forwarding/cached.py: a cacheable answer is written to disk as it streams
    stored = tee is not None and tee.would_store(client.method, upstream.status, upstream.headers)
    standard_fields(headers, ex, stored)  # RateLimit, Cache-Status (issue 41)
    # the head goes out with the first chunk: one TLS record and one send for a small answer
    client.start(upstream.status, upstream.reason, headers)
    if tee is not None:
        await tee.start(client.method, upstream.status, upstream.headers)
    while True:
        try:  # a cut (reset, TLS without close_notify, short of its length) raises here
            chunk = await upstream.read(CHUNK)
        except Exception as e:  # noqa: BLE001 - any failure: one line, the client sees a cut
            # Headers are gone already: cut the client off so it sees a truncated body, never a short one.
            ex.note = "upstream_broke"
            why = f"{type(e).__name__}: {e}"
            log.info("%s %s: upstream failed mid-body: %s", client.method, loggable(upstream.url), why)
            client.abort()
            return
        if not chunk:
            break
        if tee is not None:  # before the client has it: a client that leaves at its last byte loses nothing
            await tee.write(chunk)
        try:
            await client.write(chunk)
        except ConnectionError:
            return _client_gone(client, upstream, ex)
        ex.bytes += len(chunk)
        events.bytes_relayed("upstream_to_client", len(chunk))
    try:
        await client.end()
    except ConnectionError:
        _client_gone(client, upstream, ex)


def _throttle_passed_on(status: int, ex: Exchange) -> bool:
    """429 and 503 always; a 403 only when the pacer read it as a block (it recorded a delay): an S3
    AccessDenied is that request's answer, and a Retry-After would send the client back for the same 403."""
    return status in RETRY_AFTER_STATUSES and (status != 403 or ex.retry_after is not None)


def _client_gone(client: ClientSide, upstream: Answer, ex: Exchange) -> None:
    ex.note = "client_gone"
    log.info("%s %s %s: client went away", client.remote, client.method, loggable(upstream.url))
