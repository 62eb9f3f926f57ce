"""Wires the layers together from a Config, runs them, and reloads tunables without a restart."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from politeproxy.config import loading as config_mod
from politeproxy.config.loading import Config, ConfigError, parse_hostport
from politeproxy.config.startup import (
    announce_pacing,
    config_line,
    config_view,
    open_data_dir,
    probe_store,
)
from politeproxy.config.storebuild import StartupError, StoreSet, build_stores, make_index_answers
from politeproxy.observe import admin as admin_mod
from politeproxy.observe.announce import Announcer
from politeproxy.observe.fanout import fan_out
from politeproxy.observe.gauges import refresh_gauges
from politeproxy.observe.logs import AccessLog
from politeproxy.observe.metrics import Metrics
from politeproxy.observe.release_route import ReleasingAdmin
from politeproxy.observe.status import StatusBoard, StatusEvents
from politeproxy.observe.workers import WorkerSet, serve_private
from politeproxy.pacing.pacer import Pacer
from politeproxy.policy.access import GUEST, Access, is_loopback
from politeproxy.policy.classify import Classifier
from politeproxy.policy.hosts import HostSet
from politeproxy.policy.loglimit import LogLimiter
from politeproxy.policy.settings import format_gap, format_utc
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.proxy.door.ca import CertificateAuthority
from politeproxy.proxy.forwarding.cached import CacheFront
from politeproxy.proxy.forwarding.eventlog import events_log
from politeproxy.proxy.forwarding.robots_fetch import RobotsWatcher
from politeproxy.proxy.listener import Proxy, Timeouts
from politeproxy.proxy.origin.upstream import Upstream
from politeproxy.stores.base import Store

log = logging.getLogger("politeproxy")
start_log = logging.getLogger("politeproxy.start")  # always at INFO (cli.setup_logging)


class App:
    """The composition root: builds every part from a Config (``start``), reloads what a reload may change
    (``reload``, on a file change or SIGHUP), and closes them in order (``close``). It wires parts and
    hands them to each other; it counts and paces nothing itself, and logs only its own start, reload and
    stop lines."""

    def __init__(
        self, cfg: Config, config_path: str | None = None, overrides: dict[str, Any] | None = None
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.overrides = overrides or {}  # env and flags, applied again on every reload
        self.metrics = Metrics()
        self._paced: list[str] = []
        self._guests = LogLimiter(burst=1, window=60.0, max_keys=256)
        self.proxy: Proxy | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._mtime = self._stat()
        self.config_seen = config_view(config_path, self._mtime is not None)  # for /status
        self._metrics_runner: web.BaseRunner | None = None
        self.stopped = asyncio.Event()
        self.cache: CacheFront | None = None
        # One of the processes of `run --workers N` (commands/supervisor.py), or None: the only one.
        self.workers = WorkerSet.from_env()
        self._worker_runner: web.BaseRunner | None = None
        self.announcer: Announcer | None = None

    def _stat(self) -> tuple[int, int] | None:
        """(mtime, size) of the config file: a change in either is a change to look at."""
        try:
            st = os.stat(self.config_path) if self.config_path else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size) if st else None

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Start a task the App owns: kept referenced here, cancelled and awaited by close()."""
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=name))

    async def start(self) -> Proxy:
        """Start everything; a failure the user can fix is a one-line StartupError (exit 2)."""
        cfg, s = self.cfg, self.cfg.sections
        host, port = cfg.listen
        access = self._access(host, port)
        hosts = HostSet(cfg.paced_hosts)
        self._paced = hosts.concrete_hosts()  # the services whose request windows are shown
        self.metrics.pin_hosts(hosts.concrete_hosts())  # configured hosts always keep their labels
        ca = await asyncio.to_thread(open_data_dir, cfg.data_dir, hosts)
        try:
            self.stores = stores = build_stores(cfg, self._store_changed)
        except ConfigError as e:  # POLITEPROXY_CLOCK_OFFSET; cli checks it first, this is the backstop
            raise StartupError(str(e)) from None
        self.store = store = stores.store
        await probe_store(stores, s.schedule)  # backend redis: names its address, reachable or not
        self.metrics.set_store(store.name, False)
        settings = cfg.pacing()
        self.metrics.prepare(hosts.concrete_hosts(), settings)  # their label sets at 0 from the start
        events = StatusEvents(self.metrics)  # metrics, plus the per-pipeline tallies of /status
        self.pacer = Pacer(store, settings, events, notes=stores.notes)
        self.status = StatusBoard(self.pacer, events, hosts.concrete_hosts(), stores.backend.value)
        self.proxy = self._make_proxy(ca, access, hosts)
        # The shared disk cache (issue 14); None when cache.enabled = false or its directory is unusable.
        shared = make_index_answers(cfg, stores)  # kept index answers in Redis too (issue 43)
        self.cache = await CacheFront.open(cfg.cache(), cfg.data_dir, events, settings.max_wait, shared)
        self.proxy.forwarder.cache = self.cache
        if self.cache is not None:  # a stale collinfo.json is served while the index rests (issue 43)
            self.cache.published.resting = self.proxy.forwarder.backoff_left
        try:
            await self.proxy.start(host, port, reuse_port=self.workers is not None)
        except OSError as e:
            await self.upstream.close()
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None
        self.pacer.start()
        try:
            await self._join_workers()
        except OSError as e:
            await self.close()
            raise StartupError(f"worker channel {e.filename or ''}: {e.strerror}") from None
        self.metrics.set_configured_gap(settings.gap)
        if where := s.general.metrics_listen:
            try:
                await self._start_metrics(where)
            except OSError as e:
                await self.close()
                raise StartupError(f"cannot serve metrics on {where}: {e.strerror}") from None
        self._run_beside(stores, f"{host}:{port}")
        self._announce(settings.gap, ca.cert_path)
        start_log.info("%s", config_line(self.config_path, self._mtime is not None))
        self.status.config = lambda: self.config_seen
        announce_pacing(settings)  # the effective rates, without -v
        return self.proxy

    def _access(self, host: str, port: int) -> Access:
        """Who may use the proxy (addresses, users, pipeline and admin tokens); never an open proxy beyond
        loopback."""
        cfg, s = self.cfg, self.cfg.sections
        try:
            tokens = cfg.pipeline_tokens()  # [pipelines.NAME] token_env / token_file (issue 27)
            admin_token = cfg.admin_token()  # [admin] token_env / token_file: /release wants it (issue 42)
        except ConfigError as e:
            raise StartupError(str(e)) from None
        access = Access(
            allow_clients=s.general.allow_clients, users=s.auth.users, tokens=tokens, on_guest=self._guest,
            admin_token=admin_token,
        )  # fmt: skip
        if not is_loopback(host) and host != "localhost" and not access.open_beyond_loopback:
            raise StartupError(
                f"refusing to listen on {host}:{port} as an open proxy: "
                "set allow_clients (CIDRs) or [auth] users"
            )
        return access

    def _run_beside(self, stores: StoreSet, listen: str) -> None:
        """The tasks that run beside the proxy: the gauges, the status history, the heartbeat that counts
        the proxies on one store, and the config file's watch."""
        self._spawn(refresh_gauges(self.pacer, self.metrics, self._paced), "gauges")
        self._spawn(self.status.run(), "status history")
        self.announcer = Announcer(
            stores.beats, self.pacer, listen, stores.live, on_count=self.metrics.proxies_counted
        )
        self.status.proxies = self.announcer.rows
        self._spawn(self.announcer.run(), "heartbeat")
        if self.config_path:
            self._spawn(self._watch_config(), "config watch")

    def _make_proxy(self, ca: CertificateAuthority, access: Access, hosts: HostSet) -> Proxy:
        cfg, s = self.cfg, self.cfg.sections
        up, rb, cl = s.upstream, s.robots, s.client
        self.upstream = Upstream(
            resolve=up.resolve, ca_file=up.ca_file, connect_timeout=up.connect_timeout,
            read_timeout=up.read_timeout, max_connections=up.max_connections,
        )  # fmt: skip
        self.robots = RobotsWatcher(
            self.pacer, self.upstream, ttl=rb.ttl, cap=rb.max_crawl_delay, enabled=rb.enabled
        )
        self.classifier = Classifier(hosts, cfg.exempt_rules())
        timeouts = Timeouts(
            handshake=cl.handshake_timeout, header=cl.header_timeout, idle=cl.idle_timeout,
            max_header_size=cl.max_header_size, max_connections=cl.max_connections,
        )  # fmt: skip
        status, listen = self.status.document, cfg.listen[0]
        self.admin = ReleasingAdmin(
            self.metrics, self._health, ca.pem, status, hosts=s.general.admin_hosts, listen=listen,
            release=self._release,
            token=access.admin_token,
        )  # fmt: skip
        return Proxy(
            ca=ca,
            classifier=self.classifier,
            pacer=self.pacer,
            upstream=self.upstream,
            events=fan_out(ProxyEvents, self.metrics, AccessLog()),  # the access line's format is logs.py's
            access=access,
            timeouts=timeouts,
            admin=self.admin.on_proxy_port(access),
            robots=self.robots,
            tunnel_ports=frozenset(s.general.tunnel_ports),
            allow_private_destinations=s.general.allow_private_destinations,
            allow_ip_connect=s.general.allow_ip_connect,
        )

    def _guest(self, name: str, client: str) -> None:
        """A request named a pipeline that has a token, without it: logged once a minute per name."""
        if self._guests.hit(name, time.monotonic()).log:
            log.warning(
                "a request from %s named pipeline %s without its token: it counts as %s%s (weight 1)",
                client, name, name, GUEST,
            )  # fmt: skip

    async def _release(self, host: str, who: str) -> dict[str, Any]:
        """``POST /release``: the pacer lifts the hold for every proxy on the store."""
        assert self.pacer is not None
        r = await self.pacer.holds.release(host, who)
        if r.refused:  # not held, or released moments ago (issue 42): nothing was written
            return {"released": [], "refused": r.refused, "retry_after": r.retry_in}
        if self.status is not None:
            self.status.invalidate()
        was = [f"{n.host}: {n.reason or n.kind} since {format_utc(n.since)}" for n in r.was]
        return {"released": list(r.hosts), "by": r.by, "at": round(r.at, 3), "was": was}

    def _announce(self, gap: float, ca_path: Path) -> None:
        assert self.proxy is not None
        host, port = self.cfg.listen[0], self.proxy.port
        rate = format_gap(gap)  # "200ms (5/s)", as in the pacing lines
        log.info(
            "politeproxy listening on %s:%d; global rate %s; store %s; data dir %s; CA %s",
            host,
            port,
            rate,
            self.store.name,
            self.cfg.data_dir,
            ca_path,
        )
        if not log.isEnabledFor(logging.INFO):
            # Without -v, one line still tells a new user that it is up and where (JSON in json mode).
            start_log.info("politeproxy listening on %s:%d (-v for details)", host, port)

    def _store_changed(self, active: Store, degraded: bool) -> None:
        """A switch-over of the schedule store (the failover's callback): the gauge, and a line at INFO."""
        self.metrics.set_store(active.name, degraded)
        why = "the shared store does not answer: pacing locally" if degraded else "the shared store answers"
        events_log.info("schedule store: now %s (%s)", active.name, why)

    def _health(self) -> dict[str, Any]:
        snap = self.pacer.snapshot()
        return {"store": snap.store, "degraded": snap.degraded, "queued": snap.queued}

    async def _join_workers(self) -> None:
        """A worker answers its own /metrics and /status to the others, and merges theirs into its answers."""
        if self.workers is None:
            return
        self.admin.workers = self.workers
        self._worker_runner = await serve_private(self.workers, self.metrics.render, self.status)

    async def _start_metrics(self, addr: str) -> None:
        h, p = parse_hostport(addr, "metrics_listen")
        reuse = self.workers is not None  # every worker serves it too
        allowed = list(self.cfg.sections.general.allow_clients)
        self._metrics_runner = await admin_mod.serve(self.admin, h, p, allowed, reuse)
        who = ", ".join(["loopback", *allowed])
        log.info("metrics on %s answer %s (allow_clients); others get 403", addr, who)

    async def _watch_config(self) -> None:
        """Reload when the file changes, once it has stopped changing; nothing in a reload ends the watch."""
        while True:
            await asyncio.sleep(1.0)
            m = self._stat()
            if m is None or m == self._mtime:
                continue
            # A writer may still be at it: wait until two looks 0.25 s apart agree (bounded).
            for _ in range(20):
                await asyncio.sleep(0.25)
                again = self._stat()
                if again == m:
                    break
                m = again
            self._mtime = m
            self.safe_reload("file changed")

    def safe_reload(self, why: str) -> None:
        """reload(), for the watch and SIGHUP: a bug in one reload must not stop every later one."""
        try:
            self.reload(why)
        except Exception:  # noqa: BLE001
            log.exception("config reload (%s) failed; keeping the running settings", why)

    def reload(self, why: str = "SIGHUP") -> bool:
        try:
            new = config_mod.load(self.config_path, self.overrides, allow_empty=False)
        except ConfigError as e:
            log.error("config reload (%s) rejected, keeping the running settings: %s", why, e)
            self.metrics.reloaded(False)
            return False
        for key in self.cfg.restart_changes(new):
            log.warning("config reload: %s changed but applies only after a restart", key)
        settings = new.pacing()
        if settings != self.pacer.settings:
            announce_pacing(settings)
        # Each component applies its own settings.
        self.pacer.reload(settings)
        self.classifier.reload(new.exempt_rules())
        self.robots.reload(new.robots())
        self.metrics.configure_pipelines(settings)  # a newly configured pipeline keeps its label
        self.metrics.set_configured_gap(settings.gap)
        self.metrics.reloaded(True)
        self.config_seen = config_view(self.config_path, True)
        old, self.cfg = self.cfg, new
        # Always shown (the start-up logger): after a rejected reload, the ERROR must not stay the last line.
        start_log.info("config reloaded (%s): %s", why, "; ".join(old.changes(new)) or "no changes")
        return True

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        # Awaited, so none of them still runs (or logs) against closed parts below.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.announcer is not None:
            await self.announcer.stop()
        if self.proxy:
            await self.proxy.close()
        if self.cache is not None:
            await self.cache.close()
        await self.robots.close()
        await self.pacer.close()
        await self.upstream.close()
        await self.store.close()
        if self._metrics_runner:
            await self._metrics_runner.cleanup()
        if self._worker_runner:
            await self._worker_runner.cleanup()

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, lambda: self.safe_reload("SIGHUP"))
            loop.add_signal_handler(signal.SIGTERM, self.stopped.set)
            loop.add_signal_handler(signal.SIGINT, self.stopped.set)
        except (NotImplementedError, RuntimeError):
            pass
        await self.stopped.wait()
        log.info("shutting down")
        await self.close()
