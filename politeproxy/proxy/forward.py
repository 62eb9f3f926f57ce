"""One HTTP exchange: classify, hold for a permit, go upstream, relay the answer back, log it.

Serves both kinds of request connection: plain HTTP to the proxy port (absolute-form targets, and the
admin endpoints in origin form) and HTTP/1.1 inside an intercepted tunnel.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from politeproxy.pacing.pacer import Pacer, WaitTooLong
from politeproxy.policy.access import Access
from politeproxy.policy.backoff import parse_retry_after, retry_after_seconds
from politeproxy.policy.classify import Klass
from politeproxy.policy.hosts import normalize_host
from politeproxy.proxy.responses import error_response, health_response, metrics_response
from politeproxy.proxy.upstream import CHUNK, Upstream, strip_hop_by_hop

log = logging.getLogger("politeproxy")
access_log = logging.getLogger("politeproxy.access")

REPLAYABLE = frozenset({"GET", "HEAD"})


class _RelayedResponse(web.StreamResponse):
    """Sends the head with the first body chunk: one TLS record and one send for a small answer."""

    _send_headers_immediately = False


class Forwarder:
    """The request handler of every HTTP connection the proxy serves."""

    def __init__(
        self,
        *,
        ca: Any,
        classifier: Any,
        pacer: Pacer,
        upstream: Upstream,
        metrics: Any,
        access: Access,
        robots: Any,
        log_json: bool,
        health: Callable[[], dict[str, Any]],
        tunnel_target: Callable[[RequestHandler], tuple[str, int] | None],
    ) -> None:
        self.ca = ca
        self.classifier = classifier
        self.pacer = pacer
        self.upstream = upstream
        self.metrics = metrics
        self.access = access
        self.robots = robots
        self.log_json = log_json
        self.health = health
        self.tunnel_target = tunnel_target

    def hosts_paced(self, host: str) -> bool:
        return self.classifier.hosts.matches(host)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        target = self.tunnel_target(request.protocol)  # type: ignore[arg-type]
        if target is None:
            raw = request.raw_path
            if raw.startswith("/") or raw == "*":
                return await self._admin(request)
            if not self.access.auth_ok(request.headers.get("Proxy-Authorization")):
                self.metrics.rejected("other", "auth")
                return error_response(
                    407, "proxy authentication required", {"Proxy-Authenticate": 'Basic realm="politeproxy"'}
                )
            try:
                url = URL(raw, encoded=True)
            except ValueError:
                url = URL()
            if url.scheme not in ("http", "https") or not url.host:
                self.metrics.rejected("other", "bad_request")
                return error_response(400, f"not a URL this proxy can forward: {raw[:200]!r}")
            host = normalize_host(url.host)
            return await self._forward(request, url.scheme, host, url.port or 80, url.raw_path_qs)
        host, port = target
        hh = request.headers.get("Host", "")
        if not hh and request.version < (1, 1):
            hh = f"{host}:{port}"  # HTTP/1.0 may omit Host: inside a tunnel it can only mean the target
        h_host, sep, h_port = hh.rpartition(":")
        if not sep or "]" in h_port:
            h_host, h_port = hh, str(port)  # no port in Host: the tunnel's own
        path = request.raw_path
        if not path.startswith("/"):
            try:
                u = URL(path, encoded=True)
                h_host, h_port, path = u.host or "", str(u.port or 443), u.raw_path_qs
            except ValueError:
                h_host = ""
        if normalize_host(h_host) != host or not h_port.isdigit() or int(h_port) != port:
            self.metrics.rejected(host if self.hosts_paced(host) else "other", "misdirected")
            log.info("%s: 421 request for %r inside the tunnel to %s:%d", request.remote, hh, host, port)
            return error_response(421, f"this tunnel reaches only {host}:{port}, not {hh!r}")
        return await self._forward(request, "https", host, port, path)

    async def _admin(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.rel_url.path
        if request.method not in ("GET", "HEAD"):
            return error_response(405, "admin endpoints answer GET only")
        if path == "/metrics":
            return metrics_response(self.metrics)
        if path == "/healthz":
            return health_response(self.health)
        if path == "/ca.pem":
            return web.Response(body=self.ca.pem(), content_type="application/x-pem-file")
        return error_response(404, "not found: the admin endpoints are /metrics, /healthz and /ca.pem")

    async def _forward(
        self, request: web.BaseRequest, scheme: str, host: str, port: int, path: str
    ) -> web.StreamResponse:
        started = time.monotonic()
        klass = self.classifier.classify(request.method, host, path, "Range" in request.headers)
        label = host if klass is not Klass.PASSTHROUGH else "other"
        netloc = f"[{host}]" if ":" in host else host
        url = URL(f"{scheme}://{netloc}:{port}{path or '/'}", encoded=True)
        info: dict[str, Any] = {"wait": 0.0, "status": 0, "bytes": 0}
        try:
            resp = await self._exchange(request, klass, host, url, started, info)
        finally:
            info["duration"] = time.monotonic() - started
            self._access(request, host, klass, info)
        self.metrics.answered(label, klass.value, info["status"] or None)
        return resp

    def _access(self, request: web.BaseRequest, host: str, klass: Klass, info: dict[str, Any]) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        if self.log_json:
            access_log.info(
                json.dumps(
                    {
                        "client": request.remote,
                        "method": request.method,
                        "host": host,
                        "class": klass.value,
                        "wait": round(info["wait"], 4),
                        "status": info["status"],
                        "bytes": info["bytes"],
                        "duration": round(info["duration"], 4),
                        **({"note": info["note"]} if "note" in info else {}),
                    }
                )
            )
        else:
            access_log.info(
                "%s %s %s %s wait=%.3fs status=%s bytes=%d duration=%.3fs%s",
                request.remote,
                request.method,
                host,
                klass.value,
                info["wait"],
                info["status"],
                info["bytes"],
                info["duration"],
                f" note={info['note']}" if "note" in info else "",
            )

    async def _exchange(
        self,
        request: web.BaseRequest,
        klass: Klass,
        host: str,
        url: URL,
        arrived: float,
        info: dict[str, Any],
    ) -> web.StreamResponse:
        method = request.method
        has_body = request.body_exists
        headers = strip_hop_by_hop(request.headers, drop=("Host", "Expect"))
        retries_left = self.pacer.settings.retries if method in REPLAYABLE and not has_body else 0
        if klass is not Klass.PASSTHROUGH and self.robots is not None:
            self.robots.ensure(host)
        if has_body and request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body: AsyncIterator[bytes] | None = (
            self._body(request, self.metrics.bytes.labels("client_to_upstream")) if has_body else None
        )
        async with AsyncExitStack() as stack:
            while True:
                try:
                    if klass is Klass.PACED:
                        info["wait"] = await self.pacer.wait_paced(host, arrived)
                    elif klass is Klass.EXEMPT:
                        info["wait"] = await stack.enter_async_context(self.pacer.exempt(host, arrived))
                except WaitTooLong as e:
                    info["status"], info["note"] = 503, "max_wait"
                    return error_response(503, e.why, {"Retry-After": str(retry_after_seconds(e.wait))})
                try:
                    upstream = await self.upstream.request(method, str(url), headers, body)
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    status, message = self._upstream_error(e, url)
                    if klass is not Klass.PASSTHROUGH:
                        await self.pacer.record(host, None, None)
                    info["status"], info["note"] = status, "upstream_error"
                    log.info("%s %s: %d %s", method, url, status, message)
                    return error_response(status, message)
                if klass is not Klass.PASSTHROUGH:
                    ra = parse_retry_after(upstream.headers.get("Retry-After"), time.time())
                    delay = await self.pacer.record(host, upstream.status, ra)
                    if delay is not None and retries_left > 0:
                        elapsed = time.monotonic() - arrived
                        if elapsed + delay.seconds < self.pacer.settings.max_wait:
                            retries_left -= 1
                            upstream.close()
                            self.metrics.retries.labels(host).inc()
                            log.info(
                                "%s %s: %d from upstream; retrying after %.1fs",
                                method,
                                url,
                                upstream.status,
                                delay.seconds,
                            )
                            if klass is Klass.EXEMPT:
                                await stack.aclose()
                            continue
                info["status"] = upstream.status
                return await self._relay(request, upstream, info)

    @staticmethod
    async def _body(request: web.BaseRequest, counter: Any) -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(CHUNK):
            counter.inc(len(chunk))
            yield chunk

    @staticmethod
    def _upstream_error(e: BaseException, url: URL) -> tuple[int, str]:
        where = f"{url.host}:{url.port}"
        if isinstance(e, aiohttp.ClientConnectorDNSError):
            return 502, f"cannot resolve {url.host}"
        if isinstance(e, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
            return 502, f"TLS to {where} failed: {getattr(e, 'certificate_error', e)}"
        if isinstance(e, aiohttp.ConnectionTimeoutError):
            return 504, f"connecting to {where} timed out"
        if isinstance(e, aiohttp.ServerTimeoutError | TimeoutError):
            return 504, f"{where} did not answer in time"
        if isinstance(e, aiohttp.ClientConnectorError):
            return 502, f"cannot connect to {where}: {e.strerror or e}"
        return 502, f"upstream {where} failed: {type(e).__name__}: {e}"

    async def _relay(
        self, request: web.BaseRequest, upstream: aiohttp.ClientResponse, info: dict[str, Any]
    ) -> web.StreamResponse:
        headers = strip_hop_by_hop(upstream.headers)
        out = _RelayedResponse(status=upstream.status, reason=upstream.reason, headers=headers)
        counter = self.metrics.bytes.labels("upstream_to_client")
        try:
            await out.prepare(request)
            async for chunk in upstream.content.iter_chunked(CHUNK):
                await out.write(chunk)
                info["bytes"] += len(chunk)
                counter.inc(len(chunk))
            await out.write_eof()
        except (aiohttp.ClientError, TimeoutError) as e:
            # Headers are gone already: cut the client off so it sees a truncated body, never a short one.
            info["note"] = f"upstream_broke:{type(e).__name__}"
            log.info("%s %s: upstream failed mid-body: %r", request.method, upstream.url, e)
            if request.transport is not None:
                request.transport.abort()
        finally:
            upstream.close() if not upstream.content.at_eof() else upstream.release()
        return out
