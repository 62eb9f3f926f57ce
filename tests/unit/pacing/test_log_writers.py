"""The one log limiter's two writers: ``pacing.base.RepeatLog`` (one line per distinct error, then a count
of repeats at most once per interval, at a chosen level) and ``proxy.responses.BurstLimitedLog`` (at most a
burst of lines per client or host in a window); both count with ``policy.loglimit.LogLimiter``. Pure: fake
clocks, a captured logger."""

from __future__ import annotations

import logging

import pytest

from politeproxy.pacing.base import RepeatLog
from politeproxy.proxy.common.responses import BurstLimitedLog
from politeproxy.stores.base import StoreError


def test_repeat_log_counts_repeats_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    rl = RepeatLog(logging.getLogger("politeproxy.test"), lambda: now[0], every=60.0)
    for i in range(131):  # one a second for 130 s
        rl.error("store", RuntimeError(f"bad record {i}"))
        now[0] += 1.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines  # the first, then a count at 60 s and at 120 s
    assert "60 more times" in lines[1]


def test_repeat_log_logs_at_its_level_and_keeps_tracebacks_off_when_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The one RepeatLog serves the dispatcher (ERROR, a traceback for an unexpected error, none for a
    store fault) and the gauge refresh (WARNING, never a traceback); each line is one line."""
    now = [0.0]
    caplog.set_level(logging.DEBUG, logger="politeproxy.test")
    logger = logging.getLogger("politeproxy.test")
    errors = RepeatLog(logger, lambda: now[0])
    errors.error("dispatcher", RuntimeError("bug"))
    errors.error("dispatcher", StoreError("redis down"))
    gauge = RepeatLog(logger, lambda: now[0], level=logging.WARNING, tracebacks=False)
    gauge.error("backoff gauge refresh failed", RuntimeError("store\nunreachable"))
    got = [(r.levelno, r.exc_info is not None, r.getMessage()) for r in caplog.records]
    assert got == [
        (logging.ERROR, True, "dispatcher: RuntimeError: bug"),
        (logging.ERROR, False, "dispatcher: StoreError: redis down"),
        (logging.WARNING, False, "backoff gauge refresh failed: RuntimeError: store unreachable"),
    ]
    now[0] = 61.0
    gauge.error("backoff gauge refresh failed", RuntimeError("store unreachable"))
    assert caplog.records[-1].levelno == logging.WARNING
    assert "1 more times in 61s" in caplog.records[-1].getMessage()
    gauge.recovered("backoff gauge refresh")
    assert "recovered" in caplog.records[-1].getMessage()


def test_refusal_log_is_rate_limited_per_client_and_bounded() -> None:
    """At most ``burst`` lines per client per window, a count of the rest, and a bounded table."""
    now = [0.0]
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.repeatlog")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(Capture())
    rl = BurstLimitedLog(logger, clock=lambda: now[0], burst=3, window=10.0, max_keys=4)
    for _ in range(50):
        rl.info("10.0.0.1", "%s: 403 no", "10.0.0.1")
    rl.info("10.0.0.2", "%s: 403 no", "10.0.0.2")  # another client is not held back
    assert lines == ["10.0.0.1: 403 no"] * 3 + ["10.0.0.2: 403 no"]
    now[0] = 10.5
    rl.info("10.0.0.1", "%s: 403 no", "10.0.0.1")
    assert lines[-2:] == ["10.0.0.1: 47 more refusals not logged (rate-limited)", "10.0.0.1: 403 no"]
    for i in range(100):
        rl.allow(f"192.0.2.{i}")
    assert len(rl.limiter) == 4
    now[0] = float("nan")  # a broken clock opens a new window rather than muting a client for good
    assert rl.allow("10.0.0.9")
