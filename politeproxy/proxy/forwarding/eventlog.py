"""What the operator reads without ``-v``: backoffs, blocks, probes and refusals, one line each.

Lines go to the ``politeproxy.events`` logger, which ``logs.setup_logging`` keeps at INFO whatever the
verbosity (like the access log). Everything a client can repeat at will is rate-limited per key
(``responses.BurstLimitedLog``: a few lines per window, then one line with the count held back).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from politeproxy.policy.backoff import Delay
from politeproxy.policy.loglimit import LogLimiter
from politeproxy.policy.signals import Cause, Signal
from politeproxy.proxy.common.responses import BurstLimitedLog
from politeproxy.proxy.origin.upstream import PoolFull, loggable

events_log = logging.getLogger("politeproxy.events")
POOL_LOG_EVERY = 10.0  # seconds between "pool full" warnings for one pool
MAX_POOLS = 16  # pools are the request classes (paced, exempt, passthrough): a handful
DENIED_MANY = 10  # S3 denials of one host within DENIED_WINDOW seconds that earn the warning ...
DENIED_WINDOW = 60.0
ONCE = 86400.0  # ... given once (a day) per host; an unknown 403's headers are logged as rarely
REFUSALS_EVERY = 30.0  # seconds: refusals of one cause and pipeline make one line, then one count, per this


class OperatorLog:
    """The proxy's info lines about pacing decisions and refusals, bounded and rate-limited."""

    def __init__(
        self, logger: logging.Logger = events_log, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.clock = clock
        # Upstream answers come at most one per slot, but exempt reads can bring a burst of 503s at once.
        self.hosts = BurstLimitedLog(logger, clock, burst=5, window=10.0, max_keys=256)
        self.clients = BurstLimitedLog(logger, clock, burst=5, window=10.0, max_keys=1024)
        # a client that retries refusals at once must not flood the log (issue 41): per cause and pipeline
        self.refusals = BurstLimitedLog(logger, clock, burst=1, window=REFUSALS_EVERY, max_keys=1024)
        self._pool_full = LogLimiter(burst=1, window=POOL_LOG_EVERY, max_keys=MAX_POOLS)  # per pool
        # S3 denials counted per host (held beyond DENIED_MANY - 1 in a window: many), and warned of once
        self._denied = LogLimiter(burst=DENIED_MANY - 1, window=DENIED_WINDOW, max_keys=256)
        self._once = LogLimiter(burst=1, window=ONCE, max_keys=512)

    def answered(self, host: str, status: int | None, delay: Delay | None, probe: bool) -> None:
        """The pacer's verdict on an upstream answer: a backoff, a block, or a probe's success."""
        what = f"{status} from upstream" if status is not None else "no answer from upstream"
        if delay is not None and delay.block:  # a block stops every pipeline: the operator must see it
            self.hosts.warning(
                host, "%s: %s: blocked for %.1fs, then one probe request", host, what, delay.seconds
            )
        elif delay is not None:
            self.hosts.info(host, "%s: %s: backing off %.1fs", host, what, delay.seconds)
        elif probe:
            self.logger.info("%s: the probe after a block got %s; the host is paced again", host, status)

    def probe(self, host: str, method: str, path: str) -> None:
        """This request is the one probe sent after a block (every other waits for its answer)."""
        self.logger.info("%s: sending the probe after a block: %s %s", host, method, path)

    def refused(self, key: str, status: int, why: str, cause: str = "") -> None:
        """A refusal the proxy answered itself; ``key`` is who could repeat it (client or pipeline). With a
        ``cause`` (the pacer's reason: max_wait, queue_full, ...), one line per cause and key per
        REFUSALS_EVERY seconds, then the count of the rest."""
        if cause:
            self.refusals.info(f"{key} {status} {cause}", "%s: refused %d: %s", key, status, why)
        else:
            self.clients.info(key, "%s: refused %d: %s", key, status, why)

    def pool_full(self, e: PoolFull) -> None:
        """One warning per pool per POOL_LOG_EVERY seconds, with the count since: a full pool repeats."""
        v = self._pool_full.hit(e.pool, self.clock())
        if not v.log:
            return
        more = f" ({v.held} more since the last line)" if v.held else ""
        self.logger.warning("503: %s (a local limit, not an upstream throttle)%s", e, more)

    def signal(self, host: str, status: int, signal: Signal, headers: Mapping[str, str]) -> None:
        """Issue 24: many S3 denials in a short time earn one warning; a 403 nobody known made is logged
        once with its headers (it is held as a block). Called for every paced answer: any other cause
        returns before reading the clock."""
        if signal.cause is not Cause.S3_DENIED and signal.cause is not Cause.UNKNOWN_403:
            return
        now = self.clock()
        if signal.cause is Cause.S3_DENIED:
            if not self._denied.hit(host, now).log and self._once.hit(f"denied {host}", now).log:
                self.logger.warning(
                    "%s: %d or more 403 AccessDenied from S3 within %.0fs: S3 refuses these requests one "
                    "by one (no hold, no backoff). Most often they are unsigned: the bucket needs signed "
                    "requests, so use credentials, or read the public data over https://data.commoncrawl.org "
                    "(--no-sign-request against s3://commoncrawl is the usual misuse)",
                    host, DENIED_MANY, DENIED_WINDOW,
                )  # fmt: skip
        elif signal.cause is Cause.UNKNOWN_403 and self._once.hit(f"403 {host} {signal.server}", now).log:
            heads = "; ".join(f"{k}: {v}" for k, v in list(headers.items())[:40])
            self.logger.warning(
                "%s: %d from neither CloudFront nor S3, held as a block; its headers: %s",
                host, status, loggable(heads, 1000),
            )  # fmt: skip

    def local_failure(self, host: str, status: int, message: str) -> None:
        """The proxy's own failure (TLS trust, DNS, refused, request): no hold, so a client can repeat it
        at will; bounded like the other per-host lines."""
        if self.hosts.allow(host):
            self.logger.warning("%s: %d (local, nothing recorded): %s", host, status, message)
