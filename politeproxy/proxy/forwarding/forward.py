"""One HTTP exchange: classify, hold for a permit, go upstream, relay the answer back, log it.

Serves both kinds of request connection, both read by the one server protocol (h1server.py): plain HTTP to
the proxy port (``plain``: absolute-form targets, and the admin endpoints in origin form) and HTTP/1.1
inside an intercepted tunnel (``tunneled``, given the connection's Tunnel). The exchange itself reads and
writes a ``clientside.ClientSide`` only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from multidict import CIMultiDict
from yarl import URL

from politeproxy.pacing.pacer import Pacer, Permit, WaitTooLong
from politeproxy.policy.access import Access
from politeproxy.policy.answers import POOL_FULL, error_type
from politeproxy.policy.backoff import Delay
from politeproxy.policy.classify import Classifier, Klass
from politeproxy.policy.clients import sdk_attempt
from politeproxy.policy.forms import cloudfront_refuses, refused_form
from politeproxy.policy.hosts import normalize_host
from politeproxy.policy.signals import PEEK, Signal, read_signal, wants_body
from politeproxy.proxy.common.clientside import ClientSide, Own, own
from politeproxy.proxy.common.events import ProxyEvents, access_path
from politeproxy.proxy.common.exchange import Exchange, Tunnel
from politeproxy.proxy.common.passage import held
from politeproxy.proxy.forwarding.cached import CacheFront
from politeproxy.proxy.forwarding.eventlog import OperatorLog
from politeproxy.proxy.forwarding.relay import relay
from politeproxy.proxy.forwarding.robots_fetch import RobotsWatcher
from politeproxy.proxy.forwarding.speak import Speaker, dialect, standard_fields
from politeproxy.proxy.origin.upstream import (
    Answer,
    PoolFull,
    Upstream,
    describe_error,
    loggable,
    strip_hop_by_hop,
)

log = logging.getLogger("politeproxy")
Admin = Callable[[ClientSide], Awaitable[None]]  # answers an admin path on the proxy port (observe/admin.py)


@dataclass(slots=True)
class _Try:
    """What stays the same across the tries of one request."""

    host: str
    url: URL
    headers: CIMultiDict[str]
    body: AsyncIterator[bytes] | None
    expect: bool
    bound: float  # the longest this request may be held: its client's rule, else pacing.max_wait
    path: str  # the target as sent upstream (which service: the bucket's path-style names need it)
    attempt: int  # which try an AWS SDK says this is (amz-sdk-request); 0: not said

    @property
    def again(self) -> bool:
        """An SDK's retry of a refused request: it goes ahead of first tries in its line."""
        return self.attempt > 1

    continued: bool = False


class Forwarder:
    """The request handler of every HTTP connection the proxy serves."""

    def __init__(
        self,
        *,
        classifier: Classifier,
        pacer: Pacer,
        upstream: Upstream,
        events: ProxyEvents,
        access: Access,
        robots: RobotsWatcher | None,
        admin: Admin,
    ) -> None:
        self.classifier = classifier
        self.pacer = pacer
        self.upstream = upstream
        self.events = events
        self.access = access
        self.robots = robots
        self.admin = admin  # /metrics, /healthz, /ca.pem: answered by the top level (admin.py)
        self.oplog = OperatorLog()  # backoffs, blocks, probes, refusals: at INFO without -v
        self.cache: CacheFront | None = None  # the shared disk cache (issue 14), set by app.py when enabled
        self.speaker = Speaker()  # the bucket's refusals in S3's terms, staggered (issue 41)

    async def backoff_left(self, host: str) -> float:
        """Seconds ``host``'s backoff or rest has left, as the store records it for every proxy."""
        return (await self.pacer.host_view(host)).backoff_in

    def hosts_paced(self, host: str) -> bool:
        return self.classifier.hosts.matches(host)

    async def plain(self, client: ClientSide) -> None:
        """A request on a plain connection to the proxy port (front.py's protocol)."""
        raw = client.target
        if raw.startswith("/") or raw == "*":
            await self.admin(client)
            return
        creds = client.headers.get("Proxy-Authorization")
        why = (
            "proxy authentication required"
            if not self.access.auth_ok(creds)
            else self.access.look_alike(creds)
        )
        if why is not None:
            self.events.rejected("other", "auth")
            self.oplog.refused(client.remote, 407, why)
            await client.answer(own(407, why, {"Proxy-Authenticate": 'Basic realm="politeproxy"'}))
            return
        try:
            url = URL(raw, encoded=True)
        except ValueError:
            url = URL()
        if url.scheme not in ("http", "https") or not url.host:
            self.events.rejected("other", "bad_request")
            self.oplog.refused(client.remote, 400, "not a URL this proxy can forward")
            await client.answer(own(400, f"not a URL this proxy can forward: {raw[:200]!r}"))
            return
        host = normalize_host(url.host)
        # Who asks: this request's proxy user name, else its address
        who = self.access.pipeline(creds, client.remote)
        await self._forward(client, url.scheme, host, url.port or 80, url.raw_path_qs, who)

    async def tunneled(self, client: ClientSide, tunnel: Tunnel) -> None:
        """A request inside the intercepted ``tunnel`` (h1server.py): it may reach only the tunnel's
        host and port, and counts in the pipeline the CONNECT asked for (``tunnel.who``)."""
        host, port = tunnel.host, tunnel.port
        hh = client.headers.get("Host", "")
        if not hh and client.version < (1, 1):
            hh = f"{host}:{port}"  # HTTP/1.0 may omit Host: inside a tunnel it can only mean the target
        h_host, sep, h_port = hh.rpartition(":")
        if not sep or "]" in h_port:
            h_host, h_port = hh, str(port)  # no port in Host: the tunnel's own
        path = client.target
        if not path.startswith("/"):
            try:
                u = URL(path, encoded=True)
                h_host, h_port, path = u.host or "", str(u.port or 443), u.raw_path_qs
            except ValueError:
                h_host = ""
        if normalize_host(h_host) != host or not h_port.isdigit() or int(h_port) != port:
            self.events.rejected(host if self.hosts_paced(host) else "other", "misdirected")
            self.oplog.refused(client.remote, 421, f"{hh[:100]!r} inside the tunnel to {host}:{port}")
            await client.answer(own(421, f"this tunnel reaches only {host}:{port}, not {hh!r}"))  # no service
            return
        await self._forward(client, "https", host, port, path, tunnel.who)

    async def _forward(
        self, client: ClientSide, scheme: str, host: str, port: int, path: str, who: str
    ) -> None:
        """``who``: the pipeline asked for (the proxy user name, else the client's address)."""
        started = time.monotonic()
        klass = self.classifier.classify(client.method, host, path, "Range" in client.headers)
        netloc = f"[{host}]" if ":" in host else host
        url = URL(f"{scheme}://{netloc}:{port}{path or '/'}", encoded=True)
        # Bounded here, once: the permit, the metrics, the access line and the headers all take this name.
        pipeline = self.pacer.pipeline_of(who)
        ex = Exchange(client.remote, client.method, host, access_path(path), klass, pipeline)
        if klass is not Klass.PASSTHROUGH and self.cache is not None:
            # the last reading, for a cache hit, which waits for nothing; a miss reads it again under its
            # permit (_exchange), and without the cache every request does (no second look per request)
            ex.quota = self.pacer.quotas.cached(host)
        try:
            out = self._refused_form(client, ex, path)
            if out is not None:  # never leaves: no cache lookup, no slot, no count in the window
                pass
            elif self.cache is None:
                out = await self._exchange(client, ex, url, started)
            else:  # a hit is answered before the pacer; a miss goes through _exchange, teed to disk
                go = lambda: self._exchange(client, ex, url, started)  # noqa: E731
                out = await self.cache.exchange(client, klass, host, url, ex, go)
            if out is not None:  # our own answer (it gets Via): how long it was held
                if ex.held:
                    held(out.headers, ex.wait, ex.pipeline)
                standard_fields(out.headers, ex)
                await client.answer(dialect(out, ex, path))
        except asyncio.CancelledError:
            # the client closed its connection while we waited or relayed (the connection cancels us)
            if ex.note is None:
                ex.note = "client_gone"
            log.info("%s %s %s: client went away", client.remote, client.method, loggable(url))
            raise
        except ConnectionError:  # it left while our own answer went out
            ex.note = ex.note or "client_gone"
        finally:
            ex.duration = time.monotonic() - started
            self.events.access(ex)
        self.events.answered(ex.label, klass.value, ex.status or None, ex.pipeline)

    def _refused_form(self, client: ClientSide, ex: Exchange, path: str) -> Own | None:
        """Issue 42: a paced request of a form its service refuses by itself (policy/forms.py) is answered
        here; upstream it would spend a slot, and CloudFront's own 403 to it looks like the WAF's block."""
        if ex.klass is Klass.PASSTHROUGH:
            return None
        r = refused_form(ex.host, path, client.method, client.has_body)
        if r is None:
            return None
        ex.status, ex.note = r.status, "form"
        ex.quota = ex.quota or self.pacer.quotas.cached(ex.host)  # its answer tells the budget too
        self.events.rejected(ex.host, "form")
        self.oplog.refused(ex.pipeline, r.status, r.message)
        out = own(r.status, r.message, r.headers)
        # a client waiting for 100 Continue still holds its body back: this connection cannot go on
        out.close = client.has_body and client.headers.get("Expect", "").lower() == "100-continue"
        return out

    async def _exchange(self, client: ClientSide, ex: Exchange, url: URL, arrived: float) -> Own | None:
        """The exchange upstream; the proxy's own answer when there is one to send (None: relayed)."""
        host, klass = ex.host, ex.klass
        has_body = client.has_body
        t = _Try(
            host=host,
            url=url,
            headers=strip_hop_by_hop(client.headers, drop=("Host", "Expect")),
            body=self._body(client, self.events, ex) if has_body else None,
            expect=has_body and client.headers.get("Expect", "").lower() == "100-continue",
            bound=self.pacer.settings.bound_for(client.headers.get("User-Agent")),
            path=url.raw_path_qs,
            attempt=sdk_attempt(client.headers.get("amz-sdk-request")),
        )
        while True:
            try:
                if klass is Klass.PASSTHROUGH:
                    out = await self._attempt(client, None, t, ex)
                else:
                    permit = self.pacer.permit(host, klass, arrived, ex.pipeline, t.bound, t.again)
                    async with permit as p:
                        ex.wait = p.waited
                        ex.quota = await self.pacer.quotas.quota(host) or ex.quota
                        out = await self._attempt(client, p, t, ex)
            except WaitTooLong as e:
                return await self._refused(e, t, ex, arrived)
            if out is None or isinstance(out, Own):
                return out
            ex.retries += 1
            await asyncio.sleep(out)  # bounded: the permit's retry decision keeps it within max_wait

    async def _refused(self, e: WaitTooLong, t: _Try, ex: Exchange, arrived: float) -> Own:
        """The pacer's refusal: 503, with when to come back in the terms the client reads (issue 41)."""
        now = time.monotonic()
        ex.status, ex.note = 503, e.reason  # "max_wait" or "queue_full"
        ex.wait = now - arrived  # held this long before the refusal
        ex.quota = await self.pacer.quotas.quota(t.host) or ex.quota
        why = e.message  # the host's rest when it rests: one cause, one text
        self.oplog.refused(ex.pipeline, 503, why, e.reason)
        gap = self.pacer.settings.pace_for(t.host)
        # An SDK's retry goes ahead of first tries: its turn falls inside its bound as soon as the retries
        # ahead of it have gone, so a first try is told to come back at once (staggered, one slot apart).
        wait = 0.0 if t.attempt == 1 else e.wait
        refusal = self.speaker.refusal(ex, t.path, why, wait, t.bound, gap, now)
        # the client holds its body back: this connection cannot go on
        refusal.close = t.expect and not t.continued
        return refusal

    async def _attempt(
        self, client: ClientSide, p: Permit | None, t: _Try, ex: Exchange
    ) -> Own | float | None:
        """One try upstream, holding the permit: None once relayed, the proxy's own answer, or how long
        to wait before a retry."""
        if t.expect and not t.continued:
            # Only now that the request may go: a client refused before this point never sent its body.
            await client.interim(b"HTTP/1.1 100 Continue\r\n\r\n")
            t.continued = True
        method = client.method
        pool = p.klass.value if p is not None else Klass.PASSTHROUGH.value
        probe = p is not None and p.probe  # the one request after a block
        if (tee := ex.tee) is not None and (gate := tee.gate) is not None and not probe:
            tee.gate = None  # the cache's last look (issue 43), once: a retry keeps the lease it took
            if await gate():  # another proxy asked: answered from its kept answer
                return None
        if probe:
            self.oplog.probe(t.host, method, ex.path)
        exchange = self.upstream.exchange(
            method, t.url, t.headers, t.body, pool, self.upstream.connect_timeout
        )
        try:
            upstream = await exchange.__aenter__()  # no AsyncExitStack per request (issue 15: hot path)
        except PoolFull as e:
            self.events.rejected(t.host if p is not None else "other", "pool_full")
            ex.status, ex.note = 503, "pool_full"
            self.oplog.pool_full(e)
            return own(503, f"{e}; try again shortly", {"Retry-After": "1"}, POOL_FULL)
        except Exception as e:  # noqa: BLE001 - every upstream failure shape is one line, never a traceback
            return await self._failed(client, p, t, e, ex)
        try:
            if p is not None and (after := await self._read_answer(p, t, upstream, ex, method)) is not None:
                return after
            ex.status = upstream.status
            await relay(client, upstream, ex, self.events)
            return None
        finally:
            await exchange.__aexit__(None, None, None)

    async def _read_answer(
        self, p: Permit, t: _Try, upstream: Answer, ex: Exchange, method: str
    ) -> float | None:
        """A paced answer read by who made it and fed back to the pacer; how long to wait before a retry on
        the client's behalf, or None: relay it."""
        # who made the answer (a 403 from S3 holds nothing); only a 403 may wait for body bytes
        st, heads = upstream.status, upstream.headers
        odd = cloudfront_refuses(method, t.body is not None)  # its 403 is never the WAF's block
        if wants_body(st, heads):
            signal = await _peeked(upstream, odd)
        else:
            signal = read_signal(st, heads, odd_form=odd)
        self.oplog.signal(t.host, st, signal, heads)
        delay = await self._answered(p, st, heads.get("Retry-After"), signal)
        self.oplog.answered(t.host, st, delay, p.probe)
        if self.robots is not None:
            self.robots.ensure(t.host)  # the host answered: worth its robots.txt
        ex.retry_after = delay.seconds if delay is not None else None
        # only a throttle is retried, never a block (issue 12): no delay, no retry to weigh
        d = p.retry(method, t.body is not None, ex.retries) if delay is not None else None
        if d is None or not d.retry:
            return None
        self.events.retried(t.host)
        log.info("%s %s: %d from upstream; retrying after %.1fs", method, loggable(t.url), st, d.after)
        return d.after

    async def _answered(
        self, p: Permit, status: int | None, retry_after: str | None, signal: Signal | None
    ) -> Delay | None:
        """Feed the answer back (shielded inside the facade); a Retry-After nobody can parse still counts."""
        try:
            d = await p.answered(status, retry_after, signal)
        except Exception as e:  # noqa: BLE001 - the facade should not raise; the throttle must not be lost
            log.warning(
                "%s: feedback with Retry-After %r failed (%s); recorded without it", p.host, retry_after, e
            )
            try:
                d = await p.answered(status, None, signal)
            except Exception as e2:  # noqa: BLE001
                log.warning("%s: feedback failed: %s", p.host, e2)
                return None
        return d

    async def _failed(
        self, client: ClientSide, p: Permit | None, t: _Try, e: BaseException, ex: Exchange
    ) -> Own:
        if ex.note == "client_gone":  # the request body broke on our side: not the upstream's doing
            log.info("%s %s %s: client went away", client.remote, client.method, loggable(t.url))
            ex.status = 499
            return own(400, "the request body ended early")
        status, message, local = describe_error(e, t.url)
        message = loggable(message, 600)
        if local:  # the proxy's own failure: no backoff, no hold, nothing in the store (issue 24)
            ex.status, ex.note = status, "local_error"
            self.oplog.local_failure(t.host, status, message)
            return own(status, message, error=error_type(status, local))
        if p is not None:
            self.oplog.answered(t.host, None, await self._answered(p, None, None, None), False)
        ex.status, ex.note = status, "upstream_error"
        log.info("%s %s: %d %s", client.method, loggable(t.url), status, message)
        return own(status, message)

    @staticmethod
    async def _body(client: ClientSide, events: ProxyEvents, ex: Exchange) -> AsyncIterator[bytes]:
        try:
            async for chunk in client.body():
                events.bytes_relayed("client_to_upstream", len(chunk))
                yield chunk
        except OSError:  # ClientGone: its body broke or stalled
            ex.note = "client_gone"
            raise


async def _peeked(upstream: Answer, odd_form: bool) -> Signal:
    """A 403's cause from its head and its body's first bytes (peeked, left for the relay). Never raises:
    an answer that cannot be read is a 403 from nobody known."""
    try:
        head = await upstream.peek(PEEK)
        return read_signal(upstream.status, upstream.headers, head, odd_form=odd_form)
    except Exception:  # noqa: BLE001 - an odd answer must not lose its feedback
        return read_signal(upstream.status, {}, b"", odd_form=odd_form)
