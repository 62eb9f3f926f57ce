"""The access line as a test reads it: one Exchange rendered through AccessLog with a given formatter."""

from __future__ import annotations

import io
import logging

from politeproxy.observe.logs import AccessLog
from politeproxy.proxy.common.exchange import Exchange


def render(formatter: logging.Formatter, record: Exchange) -> str:
    """The line ``AccessLog`` writes for ``record``, on a logger of its own (nothing else sees it)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"politeproxy.access.test{id(out)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    AccessLog(logger).access(record)
    return out.getvalue().strip()
