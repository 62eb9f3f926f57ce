"""What ``politeproxy simulate`` reads and counts, without the simulation itself (policy core, no I/O).

- ``parse_workload``: ``"exempt=50/s,paced=5/s"``, optionally per pipeline and host
  (``"a:paced=5/s,b:exempt@commoncrawl.s3.amazonaws.com=20/s"``), into ``Stream`` values;
- ``arrivals``: the requests a set of streams makes in a span, evenly spaced, in time order;
- ``access_arrival``: one line of the proxy's own access log (plain or JSON) as the request it was;
- ``peak``: the most send times any trailing window of a given length holds;
- ``SimCounts`` and the report's rows, and ``render``, the report as the plain table.

Every parser here reads text a user typed or a file anyone may have written: it returns a value or raises
``WorkloadError`` (a ValueError with a message fit for one line), never anything else.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from politeproxy.policy.fairness import DEFAULT_PIPELINE, clean_name
from politeproxy.policy.hosts import normalize_host, valid_hostname

PACED = "paced"
EXEMPT = "exempt"
CLASSES = (PACED, EXEMPT)
DEFAULT_HOST = "data.commoncrawl.org"  # where a stream without ``@host`` sends its requests
CC_WINDOW = 300.0  # Common Crawl's WAF: more than 6,000 requests in any 300 s blocks the IP
CC_LIMIT = 6000
MAX_STREAMS = 64  # streams in one workload
MAX_TEXT = 4096  # characters of a workload
MAX_RATE = 10_000.0  # requests per second of one stream
MAX_ARRIVALS = 2_000_000  # requests one simulation makes at most (about a minute of CPU)
MAX_LINE = 65536  # characters of an access line read (a longer one is skipped)
MAX_LONG_LINE = 1 << 20  # characters of a line skipped at most: a longer one is no access log (/dev/zero)
MAX_LOG = 2 << 30  # characters of a log read at most (2,000,000 requests take about 0.5 GB of lines)

_RATE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,15})?) ?/ ?(s|sec|m|min|h|hour)")
_PER = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}
_ITEM = re.compile(r"(?:([^:=@]*):)? *([A-Za-z]+) *(?:@([^=]*))?=(.*)")


class WorkloadError(ValueError):
    """A workload, a duration or a log the simulation cannot use: the message says why, on one line."""


@dataclass(frozen=True, slots=True)
class Stream:
    """Requests of one class from one pipeline to one host, ``rate`` per second."""

    pipeline: str
    klass: str  # PACED or EXEMPT
    host: str
    rate: float


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request reaching the proxy at ``t`` (seconds from the start of the simulation)."""

    t: float
    pipeline: str
    klass: str
    host: str


def _shown(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def parse_rate(text: str) -> float:
    """Requests per second from "5/s", "300/m" or "1/h" (0 < rate <= MAX_RATE)."""
    m = _RATE.fullmatch(text.strip().lower())
    if m is None:
        raise WorkloadError(f'{_shown(text)}: expected a rate such as "5/s", "300/m" or "1/h"')
    rate = float(m.group(1)) / _PER[m.group(2)]
    if not 0 < rate <= MAX_RATE:
        raise WorkloadError(f"{_shown(text)}: a rate must be above 0 and at most {MAX_RATE:.0f}/s")
    return rate


def _host(text: str) -> str:
    h = normalize_host(text)
    if not valid_hostname(h):
        raise WorkloadError(f"{_shown(text)}: not a host name")
    return h


def _pipeline(text: str) -> str:
    name = text.strip()
    if not name or clean_name(name) != name:
        raise WorkloadError(f"pipeline {_shown(text)}: 1-64 printable characters, no spaces or quotes")
    return name


def _item(text: str) -> Stream:
    m = _ITEM.fullmatch(text.strip())
    if m is None:
        raise WorkloadError(f'{_shown(text)}: expected [PIPELINE:]CLASS[@HOST]=RATE, e.g. "paced=5/s"')
    pipe, klass, host, rate = m.groups()
    klass = klass.lower()
    if klass not in CLASSES:
        raise WorkloadError(f"{_shown(text)}: the class is {' or '.join(CLASSES)}, not {klass!r}")
    pipeline = DEFAULT_PIPELINE if pipe is None else _pipeline(pipe)
    return Stream(pipeline, klass, DEFAULT_HOST if host is None else _host(host), parse_rate(rate))


def parse_workload(text: str) -> tuple[Stream, ...]:
    """The streams of a workload: comma-separated ``[PIPELINE:]CLASS[@HOST]=RATE`` items. A stream named
    twice (same pipeline, class and host) adds its rates."""
    if not isinstance(text, str) or not text.strip():
        raise WorkloadError('an empty workload: give rates per class, e.g. "exempt=50/s,paced=5/s"')
    if len(text) > MAX_TEXT:
        raise WorkloadError(f"the workload is {len(text)} characters long; at most {MAX_TEXT}")
    merged: dict[tuple[str, str, str], float] = {}
    for part in text.split(","):
        s = _item(part)
        key = (s.pipeline, s.klass, s.host)
        merged[key] = merged.get(key, 0.0) + s.rate
        if len(merged) > MAX_STREAMS:
            raise WorkloadError(f"more than {MAX_STREAMS} streams in one workload")
    out = tuple(Stream(p, k, h, r) for (p, k, h), r in merged.items())
    if (total := sum(s.rate for s in out)) > MAX_RATE:
        raise WorkloadError(f"{total:g} requests per second in all; at most {MAX_RATE:.0f}/s")
    return out


def count(streams: Iterable[Stream], seconds: float) -> int:
    """How many requests ``arrivals(streams, seconds)`` makes."""
    return sum(_n(s, seconds) for s in streams)


def _n(s: Stream, seconds: float) -> int:
    return max(0, math.ceil(seconds * s.rate - 1e-9))  # the i-th at i / rate, every one before ``seconds``


def arrivals(streams: Sequence[Stream], seconds: float) -> Iterator[Arrival]:
    """The requests of ``streams`` in ``[0, seconds)``, in time order: each stream evenly spaced from 0
    (its i-th request at i / rate), so a workload's start is its worst burst: every stream at once."""

    def one(s: Stream) -> Iterator[Arrival]:
        return (Arrival(i / s.rate, s.pipeline, s.klass, s.host) for i in range(_n(s, seconds)))

    return heapq.merge(*(one(s) for s in streams), key=lambda a: a.t)


def peak(times: Sequence[float], seconds: float) -> int:
    """The most of ``times`` (ascending) in any trailing window ``(t - seconds, t]``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - seconds:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# -- the proxy's access log (observe/logs.py writes it) -------------------------------------------------

# The plain line: "%(asctime)s %(levelname)s %(name)s: %(message)s", the message "CLIENT METHOD HOSTPATH
# CLASS wait=... status=... bytes=... duration=...s retries=N [note=...] pipeline=NAME [cache=...]".
_PLAIN = re.compile(
    r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[,.](\d{1,6}))? \S+ politeproxy\.access: "
    r"\S+ \S+ ([^/\s]+)\S* (paced|exempt|passthrough) (.*)"
)
_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """An access line as the request it was: when it arrived (the line's time less its duration; the
    clock of the log, seconds), its class, host, pipeline, and the tries it spent (1 + retries)."""

    arrived: float
    klass: str
    host: str
    pipeline: str
    tries: int


def _fields(rest: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in rest.split(" "):
        key, eq, value = token.partition("=")
        if eq and key not in out:
            out[key] = value
    return out


def _number(v: object, hi: float) -> float | None:
    """A finite number in [0, hi] from a log field (text or JSON), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str):
        v = v.removesuffix("s")
        if not re.fullmatch(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", v):
            return None
    if not isinstance(v, int | float | str):
        return None
    f = float(v)
    return f if 0 <= f <= hi else None


def _request(when: float, fields: dict[str, object], klass: object, host: object) -> LoggedRequest | None:
    """The request of a line whose fields were read; None for one that spent no slot or makes no sense."""
    if klass not in CLASSES or not isinstance(host, str) or fields.get("cache") == "hit":
        return None  # a passthrough spends no slot; a cache hit never reached the upstream
    h = normalize_host(host)
    duration = _number(fields.get("duration", 0), 86400.0)
    retries = _number(fields.get("retries", 0), 100.0)
    pipe = fields.get("pipeline", DEFAULT_PIPELINE)
    if not valid_hostname(h) or duration is None or retries is None or not isinstance(pipe, str):
        return None
    pipeline = clean_name(pipe.strip()) or DEFAULT_PIPELINE
    return LoggedRequest(when - duration, str(klass), h, pipeline, 1 + int(retries))


def access_arrival(line: str) -> LoggedRequest | None:
    """One access line, plain or JSON (``log_format``), as a request; None for any other line."""
    if not isinstance(line, str) or len(line) > MAX_LINE:
        return None
    line = line.strip()
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict) or obj.get("logger") != "politeproxy.access":
            return None
        ts = _number(obj.get("ts"), 1e11)
        return None if ts is None else _request(ts, obj, obj.get("class"), obj.get("host"))
    m = _PLAIN.search(line)
    if m is None:
        return None
    y, mo, d, hh, mi, ss, frac = m.groups()[:7]
    try:  # the plain line's local time, read as if UTC: only differences between lines matter
        when = (datetime(int(y), int(mo), int(d), int(hh), int(mi), int(ss)) - _EPOCH).total_seconds()
    except ValueError:
        return None
    when += int(frac) / 10 ** len(frac) if frac else 0.0
    return _request(when, dict(_fields(m.group(10))), m.group(9), m.group(8))


def log_arrivals(lines: Iterable[str], seconds: float) -> list[Arrival]:
    """The requests an access log shows, in arrival order, from the first one's arrival for ``seconds``;
    each retry the proxy made is one more request at the same arrival. At most MAX_ARRIVALS."""
    got: list[LoggedRequest] = []
    tries = 0
    for line in lines:
        r = access_arrival(line)
        if r is not None:
            got.append(r)
            tries += r.tries
            if tries > 2 * MAX_ARRIVALS:  # a log is never sorted by arrival (lines are written at the end)
                raise WorkloadError(f"the log holds more than {2 * MAX_ARRIVALS:,} requests; cut it first")
    if not got:
        raise WorkloadError("no access lines of paced or exempt requests in the log")
    got.sort(key=lambda r: r.arrived)
    t0 = got[0].arrived
    out = [
        Arrival(r.arrived - t0, r.pipeline, r.klass, r.host)
        for r in got
        if r.arrived - t0 < seconds
        for _ in range(r.tries)
    ]
    if len(out) > MAX_ARRIVALS:
        raise WorkloadError(
            f"{len(out):,} requests in the span; at most {MAX_ARRIVALS:,} (a shorter --duration)"
        )
    return out


# -- the report ------------------------------------------------------------------------------------------


@dataclass
class SimCounts:
    """One service's (or pipeline's) counts; ``sends`` holds the times its requests went."""

    offered: int = 0
    refused: int = 0
    waits: float = 0.0
    max_wait: float = 0.0
    sends: list[float] = field(default_factory=list)


def service_row(t: SimCounts, window: float, limit: int) -> dict[str, Any]:
    """A service's line of the report: its peak in the request window (``window`` s, ``limit``; 0 when
    the window is off) and in Common Crawl's own 300 s, against 6,000."""
    sends = sorted(t.sends)
    return {
        "requests": len(sends),
        "offered": t.offered,
        "refused": t.refused,
        "window_peak": peak(sends, window),
        "window_limit": limit,
        "cc_peak": peak(sends, CC_WINDOW),
        "cc_limit": CC_LIMIT,
        "mean_wait_s": round(t.waits / len(sends), 3) if sends else 0.0,
        "max_wait_s": round(t.max_wait, 3),
    }


def pipeline_row(t: SimCounts) -> dict[str, Any]:
    sent = t.offered - t.refused
    return {"requests": sent, "refused": t.refused, "mean_wait_s": round(t.waits / sent, 3) if sent else 0.0}


def _count(v: int) -> str:
    return f"{v:,}"


def render(r: dict[str, Any], what: str, notes: Iterable[str] = ()) -> str:
    """The report as a short table: one row per service, the span, and whether any peak is over."""
    lines = [*(f"note: {n}" for n in notes), f"{what}: the last request went at {r['duration_s']:,.1f}s"]
    head = ("service", "sent", "refused", "mean wait", "window peak", "limit", "CC peak", "CC limit")
    rows = [head]
    for name, v in r["services"].items():
        limit = _count(v["window_limit"]) if v["window_limit"] else "off"
        wait = f"{v['mean_wait_s']:.2f}s"
        counts = [_count(v[k]) for k in ("requests", "refused", "window_peak", "cc_peak", "cc_limit")]
        rows.append((name, *counts[:2], wait, counts[2], limit, *counts[3:]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        cells = zip(row, widths, strict=True)
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells)))
    lines.append(
        f"window peak: the most requests sent in any {r['window_s']:g} s (egress.window; limit: "
        f"egress.limit, off at 0); CC peak: in any {CC_WINDOW:g} s, what Common Crawl counts"
    )
    if len(r["pipelines"]) > 1:
        parts = [
            f"{name} {_count(v['requests'])} sent, {_count(v['refused'])} refused, "
            f"{v['mean_wait_s']:.2f}s wait"
            for name, v in r["pipelines"].items()
        ]
        lines.append("pipelines: " + "; ".join(parts))
    over = [f"{n} (window peak {_count(r['services'][n]['window_peak'])})" for n in r["over_limit"]]
    over += [f"{n} (Common Crawl blocks above {CC_LIMIT:,} per 300 s)" for n in r["over_cc"]]
    if over:
        lines.append("OVER: " + "; ".join(over))
    else:
        lines.append(f"every peak is within its window limit and Common Crawl's {CC_LIMIT:,} per 300 s")
    return "\n".join(lines)
