"""What the operator reads without ``-v``: backoffs, blocks, probes and refusals, one line each.

Lines go to the ``politeproxy.events`` logger, which ``logs.setup_logging`` keeps at INFO whatever the
verbosity (like the access log). Everything a client can repeat at will is rate-limited per key
(``responses.BurstLimitedLog``: a few lines per window, then one line with the count held back).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from politeproxy.policy.backoff import Delay
from politeproxy.proxy.responses import BurstLimitedLog
from politeproxy.proxy.upstream import PoolFull

events_log = logging.getLogger("politeproxy.events")
POOL_LOG_EVERY = 10.0  # seconds between "pool full" warnings for one pool
MAX_POOLS = 16  # pools are the request classes (paced, exempt, passthrough): a handful


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
        self._pool_full: dict[str, tuple[float, int]] = {}  # pool -> (last line, lines held back)

    def answered(self, host: str, status: int | None, delay: Delay | None, probe: bool) -> None:
        """The pacer's verdict on an upstream answer: a backoff, a block, or a probe's success."""
        what = f"{status} from upstream" if status is not None else "no answer from upstream"
        if delay is not None and delay.block:
            self.hosts.info(
                host, "%s: %s: blocked for %.1fs, then one probe request", host, what, delay.seconds
            )
        elif delay is not None:
            self.hosts.info(host, "%s: %s: backing off %.1fs", host, what, delay.seconds)
        elif probe:
            self.logger.info("%s: the probe after a block got %s; the host is paced again", host, status)

    def probe(self, host: str, method: str, path: str) -> None:
        """This request is the one probe sent after a block (every other waits for its answer)."""
        self.logger.info("%s: sending the probe after a block: %s %s", host, method, path)

    def refused(self, key: str, status: int, why: str) -> None:
        """A refusal the proxy answered itself; ``key`` is who could repeat it (client or pipeline)."""
        self.clients.info(key, "%s: refused %d: %s", key, status, why)

    def pool_full(self, e: PoolFull) -> None:
        """One warning per pool per POOL_LOG_EVERY seconds, with the count since: a full pool repeats."""
        now = self.clock()
        last, count = self._pool_full.get(e.pool, (-POOL_LOG_EVERY, 0))
        if 0 <= now - last < POOL_LOG_EVERY:
            self._pool_full[e.pool] = (last, count + 1)
            return
        if e.pool not in self._pool_full and len(self._pool_full) >= MAX_POOLS:
            self._pool_full.pop(next(iter(self._pool_full)))
        self._pool_full[e.pool] = (now, 0)
        more = f" ({count} more since the last line)" if count else ""
        self.logger.warning("503: %s (a local limit, not an upstream throttle)%s", e, more)
