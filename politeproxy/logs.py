"""Logging: the handler setup, the JSON formatter, and the access line.

The forwarder hands over one structured ``AccessRecord`` per exchange (through ``ProxyEvents.access``).
``AccessLog`` logs it with a plain message and the record attached; the plain formatter prints the
message, ``JsonFormatter`` writes the record's fields. Nothing re-parses a line another part produced.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from politeproxy.proxy.events import AccessRecord, NoProxyEvents

access_log = logging.getLogger("politeproxy.access")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def access_fields(r: AccessRecord) -> dict[str, Any]:
    """The access record as the JSON log shows it (its keys are part of the log format)."""
    out: dict[str, Any] = {
        "client": r.client,
        "method": r.method,
        "host": r.host,
        "class": r.klass,
        "wait": round(r.wait, 4),
        "status": r.status,
        "bytes": r.bytes,
        "duration": round(r.duration, 4),
    }
    if r.note is not None:
        out["note"] = r.note
    if r.pipeline is not None:
        out["pipeline"] = r.pipeline
    return out


class AccessLog(NoProxyEvents):
    """The ProxyEvents sink of the access log: one INFO line per exchange on ``politeproxy.access``."""

    def __init__(self, logger: logging.Logger = access_log) -> None:
        self.logger = logger

    def access(self, record: AccessRecord) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        # Formatted only when a handler writes it; the JSON formatter reads ``extra["access"]`` instead.
        self.logger.info(
            "%s %s %s %s wait=%.3fs status=%s bytes=%d duration=%.3fs%s%s",
            record.client,
            record.method,
            record.host,
            record.klass,
            record.wait,
            record.status,
            record.bytes,
            record.duration,
            f" note={record.note}" if record.note is not None else "",
            f" pipeline={record.pipeline}" if record.pipeline is not None else "",
            extra={"access": record},
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per line; an access line's fields sit at the top level, next to ts and level."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        access = getattr(record, "access", None)
        if isinstance(access, AccessRecord):
            out.update(access_fields(access))
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(verbose: int, fmt: str) -> None:
    """Root handler on stderr, plain or JSON from the first line; -v info, -vv debug."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    pp = logging.getLogger("politeproxy")
    pp.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose >= 1 else logging.WARNING)
    # One access line per request is the default; -q style silence is a config of the log shipper.
    access_log.setLevel(logging.INFO)
    # The one "listening on" line a user sees without -v.
    logging.getLogger("politeproxy.start").setLevel(logging.INFO)
