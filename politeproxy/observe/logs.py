"""Logging: the handler setup, the JSON formatter, and the access line.

The forwarder hands over its typed ``Exchange`` once the exchange is done (through ``ProxyEvents.access``).
When the handler ``setup_logging`` made is the only one, ``AccessLog`` formats the line itself (the same
text the formatters give) and that handler writes it: no ``LogRecord``, no walk of the handlers, no
formatter per request. Any other handler (a test's, an embedding program's) gets
the record through ``logging``: a plain message with the record attached, which ``JsonFormatter`` reads
for its fields. Nothing re-parses a line another part produced.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from politeproxy.policy.loglimit import LogLimiter
from politeproxy.policy.settings import format_utc
from politeproxy.proxy.common.events import ProxyEvents
from politeproxy.proxy.common.exchange import Exchange

access_log = logging.getLogger("politeproxy.access")
# Loggers at INFO whatever the verbosity: the access line, the start line, and the operator's events
# (backoffs, blocks, probes, refusals, store switch-overs; proxy/forwarding/eventlog.py, rate-limited there).
ALWAYS_INFO = ("politeproxy.access", "politeproxy.start", "politeproxy.events")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The pacer's refusals (Exchange.note): summed per cause, host and pipeline in the access log
REFUSAL_NOTES = frozenset({"max_wait", "queue_full", "max_queued"})
REFUSALS_EVERY = 30.0  # seconds
MAX_REFUSAL_KEYS = 1024
ACCESS_FORMAT = "%s %s %s%s %s wait=%.3fs status=%s bytes=%d duration=%.3fs retries=%d%s pipeline=%s%s"


def access_fields(r: Exchange) -> dict[str, Any]:
    """The access record as the JSON log shows it (its keys are part of the log format)."""
    out: dict[str, Any] = {
        "client": r.client,
        "method": r.method,
        "host": r.host,
        "path": r.path,
        "class": r.klass,
        "wait": round(r.wait, 4),
        "status": r.status,
        "bytes": r.bytes,
        "duration": round(r.duration, 4),
    }
    if r.note is not None:
        out["note"] = r.note
    out["pipeline"] = r.pipeline
    out["retries"] = r.retries
    if r.cache is not None:
        out["cache"] = r.cache
    return out


def access_args(r: Exchange) -> tuple[object, ...]:
    """The values ``ACCESS_FORMAT`` takes. The path follows the host with no space (host/path reads as the
    URL); it has no spaces itself."""
    return (
        r.client, r.method, r.host, r.path, r.klass, r.wait, r.status, r.bytes, r.duration, r.retries,
        f" note={r.note}" if r.note is not None else "",
        r.pipeline,
        f" cache={r.cache}" if r.cache is not None else "",
    )  # fmt: skip


def _more_text(more: dict[str, Any] | None) -> str:
    return "".join(f" {k}={v}" for k, v in more.items()) if more else ""


def json_head(created: float, level: str, name: str) -> dict[str, Any]:
    """The keys every JSON line starts with (an access line's fields follow them at the top level)."""
    return {"ts": round(created, 3), "level": level, "logger": name}


class AccessLog(ProxyEvents):
    """The ProxyEvents sink of the access log: one INFO line per exchange on ``politeproxy.access``.

    Refusals are the exception (issue 41): a client that retries them at once would write a line per retry.
    Per cause, host and pipeline, the first refusal of each REFUSALS_EVERY seconds has its line; the rest are
    summed into the next one: ``repeated=N first=<UTC> last=<UTC>`` (``repeated``, ``first``, ``last`` in
    JSON), the refusals that line stands for besides its own."""

    def __init__(
        self,
        logger: logging.Logger = access_log,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.logger = logger
        self.clock = clock
        self.wall = wall
        self._refusals = LogLimiter(burst=1, window=REFUSALS_EVERY, max_keys=MAX_REFUSAL_KEYS)
        self._held: dict[str, tuple[float, float]] = {}  # key -> first and last refusal not written

    def access(self, record: Exchange) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        more: dict[str, Any] | None = None
        if record.note in REFUSAL_NOTES:
            write, more = self._summed(record)
            if not write:
                return
        args = access_args(record)
        direct = _direct_handler(self.logger)
        if direct is None:  # another handler listens: the record through logging, formatted by it
            self.logger.info(
                ACCESS_FORMAT + "%s", *args, _more_text(more), extra={"access": record, "more": more}
            )
        else:
            direct.line(self.logger.name, ACCESS_FORMAT % args + _more_text(more), record, more)

    def _summed(self, r: Exchange) -> tuple[bool, dict[str, Any] | None]:
        """Whether this refusal gets a line, and the refusals held since the last one it sums up."""
        key = f"{r.note} {r.host} {r.pipeline}"
        v = self._refusals.hit(key, self.clock())
        if not v.log:
            now = self.wall()
            first, _ = self._held.pop(key, (now, now))
            self._held[key] = (first, now)
            while len(self._held) > MAX_REFUSAL_KEYS:
                del self._held[next(iter(self._held))]
            return False, None
        span = self._held.pop(key, None)
        if not v.held or span is None:
            return True, None
        return True, {"repeated": v.held, "first": format_utc(span[0]), "last": format_utc(span[1])}


class DirectHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler ``setup_logging`` makes: a StreamHandler that also takes access lines already
    formatted (``line``), written at once as every other line is: when a client has its answer, the
    answer's line is written (a batch would make it late: an earlier one raced a reader of the log)."""

    def __init__(self, stream: Any, fmt: str) -> None:
        super().__init__(stream)
        self.json = fmt == "json"
        self.plain = PlainFormatter()

    def line(self, name: str, message: str, record: Exchange, more: dict[str, Any] | None = None) -> None:
        now = time.time()
        if self.json:
            out = json_head(now, "info", name)
            out.update(access_fields(record))
            if more:
                out.update(more)
            text = json.dumps(out)
        else:
            text = f"{self.plain.stamp(now)} INFO {name}: {message}"
        with self.lock:  # type: ignore[union-attr]  # as Handler.handle: one writer at a time
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            except Exception:  # noqa: BLE001 - a log write never takes the proxy down (logging's own rule)
                pass


def _direct_handler(logger: logging.Logger) -> DirectHandler | None:
    """The direct handler when it alone would see the logger's records, else None."""
    root = logging.root.handlers
    h = root[0] if len(root) == 1 else None
    if not isinstance(h, DirectHandler) or h.filters or logger.filters or not logger.propagate:
        return None
    parent = logger.parent
    while parent is not None and parent is not logging.root:
        if parent.handlers or not parent.propagate:
            return None
        parent = parent.parent
    return None if logger.handlers else h


class JsonFormatter(logging.Formatter):
    """One JSON object per line; an access line's fields sit at the top level, next to ts and level."""

    def format(self, record: logging.LogRecord) -> str:
        out = json_head(record.created, record.levelname.lower(), record.name)
        access = getattr(record, "access", None)
        if isinstance(access, Exchange):
            out.update(access_fields(access))
            more = getattr(record, "more", None)
            if isinstance(more, dict):
                out.update(more)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class PlainFormatter(logging.Formatter):
    """``PLAIN_FORMAT``, its date and time text made once per second instead of once per line (a
    ``strftime`` and a ``localtime`` per access line otherwise; the output is the same)."""

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.stamp(record.created, record.msecs)

    def stamp(self, created: float, msecs: float | None = None) -> str:
        """The asctime of a record made at ``created`` (``msecs`` as LogRecord computes it)."""
        second = int(created)
        if second != self._second:  # formatters run under the handler's lock: one thread at a time
            self._text = time.strftime(self.default_time_format, self.converter(created))
            self._second = second
        msec = self.default_msec_format  # None: no milliseconds, as logging.Formatter.formatTime does
        if msecs is None:
            msecs = int((created - second) * 1000) + 0.0  # as LogRecord computes it (gh-89047)
        return msec % (self._text, msecs) if msec else self._text


def error_line(message: str, fmt: str) -> str:
    """A fatal error as the log format writes it: ``run`` exits with it, before or after logging is set
    up, so that in JSON mode even a refusal to start is a JSON line (issue 13)."""
    if fmt == "json":
        obj = {"ts": round(time.time(), 3), "level": "error", "logger": "politeproxy", "message": message}
        return json.dumps(obj)
    return f"politeproxy: error: {message}"


def setup_logging(verbose: int, fmt: str) -> None:
    """Root handler on stderr, plain or JSON from the first line; -v info, -vv debug.

    In JSON mode Python's warnings and an uncaught exception go through the handler too, so nothing the
    process writes to stderr is plain text."""
    handler = DirectHandler(sys.stderr, fmt)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    pp = logging.getLogger("politeproxy")
    pp.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose >= 1 else logging.WARNING)
    # One access line per request is the default, and the events an operator must see; the start line.
    for name in ALWAYS_INFO:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    logging.captureWarnings(True)  # warnings.warn() as log records ("py.warnings"), in the same format
    # Neither format shows where a line was logged from, so logging need not walk the stack for the caller
    # of every record (the logging HOWTO's "Optimization" advice; the access line is one record per request).
    logging._srcfile = None
    # Nor thread, process or multiprocessing names (the same HOWTO section): each is looked up per record.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if fmt == "json":
        sys.excepthook = _log_uncaught


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)
        return
    logging.getLogger("politeproxy").critical("uncaught %s", kind.__name__, exc_info=(kind, exc, tb))
