"""The gauges read from the store rather than counted from events: each host's backoff left and effective
interval, and each service's request window. The store may be remote, so they are read once a second,
through the pacer, for the hosts its snapshot names; a failure skips that host for the round and is
logged (one line, then once a minute)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from politeproxy.observe.metrics import Metrics
from politeproxy.pacing.base import RepeatLog
from politeproxy.pacing.pacer import Pacer

log = logging.getLogger("politeproxy")


async def refresh_once(pacer: Pacer, metrics: Metrics, paced: Sequence[str], errors: RepeatLog) -> None:
    """One round: every host the pacer knows, then the windows of the configured (``paced``) hosts."""
    snap = pacer.snapshot()
    s = snap.settings
    for host in sorted(snap.hosts):
        try:
            view = await pacer.host_view(host)
            metrics.host_gauges(host, view.backoff_in, view.interval(s.pace_for(host)))
        except Exception as e:  # noqa: BLE001 - a gauge must not kill the loop
            errors.error("backoff gauge refresh failed", e)
    rules = {r.service: r for h in paced if (r := s.window_for(h)) is not None}
    for rule, n in await pacer.holds.windows(rules.values()):
        metrics.window_gauges(rule.service, n, rule.limit)


async def refresh_gauges(pacer: Pacer, metrics: Metrics, paced: Sequence[str], every: float = 1.0) -> None:
    """Forever: one round every ``every`` seconds (the composition root runs it as a task)."""
    errors = RepeatLog(log, time.monotonic, level=logging.WARNING, tracebacks=False)
    while True:
        await asyncio.sleep(every)
        await refresh_once(pacer, metrics, paced, errors)
