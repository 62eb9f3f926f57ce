"""Logging: the handler setup, the JSON formatter, and the access line.

The forwarder hands over one structured ``AccessRecord`` per exchange (through ``ProxyEvents.access``).
``AccessLog`` logs it with a plain message and the record attached; the plain formatter prints the
message, ``JsonFormatter`` writes the record's fields. Nothing re-parses a line another part produced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from politeproxy.proxy.events import AccessRecord, NoProxyEvents

access_log = logging.getLogger("politeproxy.access")
# Loggers at INFO whatever the verbosity: the access line, the start line, and the operator's events
# (backoffs, blocks, probes, refusals, store switch-overs; proxy/eventlog.py, rate-limited there).
ALWAYS_INFO = ("politeproxy.access", "politeproxy.start", "politeproxy.events")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def access_fields(r: AccessRecord) -> dict[str, Any]:
    """The access record as the JSON log shows it (its keys are part of the log format)."""
    out: dict[str, Any] = {
        "client": r.client,
        "method": r.method,
        "host": r.host,
        **({"path": r.path} if r.path is not None else {}),
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
    if r.retries is not None:
        out["retries"] = r.retries
    if r.cache is not None:
        out["cache"] = r.cache
    return out


class AccessLog(NoProxyEvents):
    """The ProxyEvents sink of the access log: one INFO line per exchange on ``politeproxy.access``."""

    def __init__(self, logger: logging.Logger = access_log) -> None:
        self.logger = logger

    def access(self, record: AccessRecord) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        # Formatted only when a handler writes it; the JSON formatter reads ``extra["access"]`` instead.
        # The path follows the host with no space (host/path reads as the URL); it has no spaces itself.
        self.logger.info(
            "%s %s %s%s %s wait=%.3fs status=%s bytes=%d duration=%.3fs%s%s%s%s",
            record.client,
            record.method,
            record.host,
            record.path or "",
            record.klass,
            record.wait,
            record.status,
            record.bytes,
            record.duration,
            f" retries={record.retries}" if record.retries is not None else "",
            f" note={record.note}" if record.note is not None else "",
            f" pipeline={record.pipeline}" if record.pipeline is not None else "",
            f" cache={record.cache}" if record.cache is not None else "",
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
        second = int(record.created)
        if second != self._second:  # formatters run under the handler's lock: one thread at a time
            self._text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return self.default_msec_format % (self._text, record.msecs)


class LoopBatchedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the lines logged during one pass of the event loop with one write.

    The access line is one record per request, each otherwise its own write system call on the loop's thread
    (issue 15, BENCHMARKS.md "cold path": 3.2 -> 2.5 writes per small GET at c=16). Lines logged on a
    thread that runs an event loop are kept until the end of the current pass (``call_soon``); a line from
    any other thread, or while no loop runs, is written at once, after the lines kept before it, so order
    holds.
    ``flush()`` (``logging.shutdown`` at exit calls it) writes what is kept. A line is at most one loop
    pass late; only a process killed within that pass loses it."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._kept: list[str] = []
        self._scheduled = False
        # The loop last seen on the thread last seen: asyncio._get_running_loop() costs a getpid()
        # system call per call on Python 3.11, once per line otherwise.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def emit(self, record: logging.LogRecord) -> None:  # called under the handler's lock (Handler.handle)
        try:
            line = self.format(record) + self.terminator
        except Exception:  # noqa: BLE001 - logging's own rule: a bad record is reported, never raised
            self.handleError(record)
            return
        self._kept.append(line)
        loop = self._loop
        if loop is None or threading.get_ident() != self._thread or not loop.is_running():
            # the first line, another thread's, or the loop seen last has stopped: look again
            loop = asyncio._get_running_loop()
            if loop is None:
                self._write_kept()  # the lines kept before this one first: order holds
                return
            self._loop, self._thread, self._scheduled = loop, threading.get_ident(), False
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._drain)

    def _drain(self) -> None:
        self.acquire()
        try:
            self._scheduled = False
            self._write_kept()
        finally:
            self.release()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_kept()
        finally:
            self.release()

    def _write_kept(self) -> None:
        if not self._kept:
            return
        text = "".join(self._kept)
        self._kept.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nowhere left to say so
            pass


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
    handler = LoopBatchedHandler(sys.stderr)
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
    logging._srcfile = None  # type: ignore[attr-defined]
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
