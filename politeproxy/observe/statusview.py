"""``politeproxy status [--watch]``: the ``GET /status`` document in the terminal, refreshed like ``top``.

The document comes from the network (any ``--admin`` URL), so it is read as untrusted: a field of the
wrong type shows as "-", text is stripped of control characters and never read as rich markup, and the
body read is bounded (``MAX_BODY``). Proxy variables are ignored: the admin port is asked directly.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

DEFAULT_INTERVAL = 2.0
MIN_INTERVAL, MAX_INTERVAL = 0.5, 60.0
FETCH_TIMEOUT = 5.0
MAX_BODY = 4 << 20  # bytes of a /status answer read at most
SPARK = "▁▂▃▄▅▆▇█"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class StatusError(Exception):
    """The proxy did not answer, or not with a status document; the message is one line."""


def admin_url(host: str, port: int) -> str:
    """The admin URL of a proxy listening on ``host:port`` (a wildcard address is asked on loopback)."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def fetch(url: str, timeout: float = FETCH_TIMEOUT) -> dict[str, Any]:
    """GET ``<url>/status``. A user name and password in ``url`` go as Proxy-Authorization (the proxy
    port asks for it from clients admitted by ``[auth] users`` alone)."""
    return admin_call(url, "/status", timeout=timeout)


def admin_call(
    url: str,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    timeout: float = FETCH_TIMEOUT,
) -> dict[str, Any]:
    """One admin endpoint's JSON answer (``path`` with its query), asked directly, never through a proxy;
    every failure is a one-line StatusError."""
    try:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StatusError(f"--admin {url!r}: want http://HOST:PORT")
        netloc = parts.netloc.rpartition("@")[2]
        base, _, query = path.partition("?")
        target = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + base, query, ""))
    except ValueError as e:
        raise StatusError(f"--admin {url!r}: {e}") from None
    sent = {"Accept": "application/json", **(headers or {})}
    req = urllib.request.Request(target, method=method, headers=sent)
    if parts.username is not None:
        cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        req.add_header("Proxy-Authorization", "Basic " + base64.b64encode(cred).decode())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with opener.open(req, timeout=timeout) as r:
            body = r.read(MAX_BODY + 1)
    except urllib.error.HTTPError as e:
        detail = _CONTROL.sub(" ", e.read(300).decode("utf-8", "replace")).strip()
        detail = f": {detail}" if detail else ""
        raise StatusError(f"{target} answered {e.code} {e.reason}{detail}") from None
    except (urllib.error.URLError, OSError) as e:
        why = getattr(e, "reason", None) or e
        raise StatusError(f"no answer from {target}: {why} (is `politeproxy run` up? --admin URL)") from None
    if len(body) > MAX_BODY:
        raise StatusError(f"{target}: the answer is over {MAX_BODY} bytes")
    try:
        doc = json.loads(body)
    except ValueError:
        raise StatusError(f"{target} did not answer with JSON (an older politeproxy?)") from None
    if not isinstance(doc, dict):
        raise StatusError(f"{target} did not answer with a JSON object")
    return doc


# -- reading the document defensively ---------------------------------------------------------------


def _get(d: Any, key: str) -> Any:
    return d.get(key) if isinstance(d, dict) else None


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def plain(x: Any, limit: int = 80) -> Text:
    """Text for a cell: no control characters (no terminal escapes), no markup, at most ``limit`` chars."""
    s = "" if x is None else _CONTROL.sub("?", str(x))
    return Text(s if len(s) <= limit else s[: limit - 1] + "…")


def fmt(x: Any, unit: str = "", digits: int = 2) -> str:
    v = _num(x)
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def duration(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "-"
    v = int(max(0.0, min(v, 1e9)))
    h, rest = divmod(v, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def sparkline(points: Any, width: int = 60) -> str:
    """The achieved rate of the last ``width`` history points, scaled to the highest rate shown."""
    rows = (
        [p for p in points if isinstance(p, list) and len(p) > 2][-width:] if isinstance(points, list) else []
    )
    vals = [(max(0.0, _num(p[1]) or 0.0), max(0.0, _num(p[2]) or 0.0)) for p in rows]
    top = max((max(a, c) for a, c in vals), default=0.0)
    if top <= 0:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(len(SPARK) - 1, int(a / top * (len(SPARK) - 1) + 0.5))] for a, _c in vals)


STATE_STYLE = {
    "ok": "green",
    "slowed": "yellow",
    "backing off": "yellow",
    "blocked": "bold red",
    "unknown": "dim",
}


def _clock(t: Any) -> str:
    v = _num(t)
    return "-" if v is None or v <= 0 else time.strftime("%H:%M:%SZ", time.gmtime(v))


def hold_text(h: Any) -> str:
    """Why a host is held, from its row's ``hold``: the cause, since and until when, the next probe."""
    hold = _get(h, "hold")
    if not isinstance(hold, dict):
        return str(_get(h, "detail") or "")
    why = _get(hold, "reason") or _get(hold, "kind") or "held"
    text = f"{why}; since {_clock(_get(hold, 'since'))} until {_clock(_get(hold, 'until'))}"
    if _num(_get(hold, "next_probe_in_s")) is not None:
        text += f"; probe in {fmt(_get(hold, 'next_probe_in_s'), ' s', 1)}"
    if _get(hold, "released_by"):
        text += f"; released by {_get(hold, 'released_by')} at {_clock(_get(hold, 'released_at'))}"
    return text


def _windows(doc: Any) -> Table:
    t = Table(title="request windows (Common Crawl blocks above 6,000 in 300 s)", title_justify="left")
    for name in ("service", "egress", "window", "requests", "limit", "used"):
        t.add_column(name, justify="left" if name in ("service", "egress") else "right", no_wrap=True)
    rows = _get(doc, "windows")
    for w in rows if isinstance(rows, list) else []:
        share = _num(_get(w, "share"))
        style = "bold red" if share is not None and share >= 0.9 else ""
        t.add_row(
            plain(_get(w, "service")),
            plain(_get(w, "egress"), 40),
            fmt(_get(w, "window_s"), " s", 0),
            fmt(_get(w, "requests"), "", 0),
            fmt(_get(w, "limit"), "", 0),
            Text("-" if share is None else f"{100 * share:.0f}%", style=style),
        )
    return t


def _hosts(doc: Any) -> Table:
    t = Table(title="hosts", title_justify="left", expand=False)
    for name, right in (("host", False), ("state", False), ("left", True), ("interval", True),
                        ("queued", True), ("exempt", True), ("detail", False)):  # fmt: skip
        # Every column keeps its header readable; the host name and the detail give way first.
        t.add_column(
            name,
            justify="right" if right else "left",
            no_wrap=name not in ("host", "detail"),  # these two give way (ellipsis, wrap) when narrow
            min_width={"host": 12, "state": 11, "detail": 6}.get(name, len(name)),
            overflow="ellipsis",
        )
    rows = _get(doc, "hosts")
    for h in rows if isinstance(rows, list) else []:
        state = str(_get(h, "state"))
        t.add_row(
            plain(_get(h, "host")),
            Text(plain(state, 20).plain, style=STATE_STYLE.get(state, "")),
            "" if state == "ok" else fmt(_get(h, "seconds_left"), " s", 1),
            fmt(_get(h, "effective_interval_s"), " s", 3),
            fmt(_get(h, "queued"), "", 0),
            fmt(_get(h, "exempt_in_flight"), "", 0),
            plain(hold_text(h) if state != "ok" else _get(h, "detail"), 120),
        )
    return t


def _pipelines(doc: Any) -> Table:
    t = Table(title="pipelines", title_justify="left", expand=False)
    cols = ("pipeline", "queued", "grants/min", "share", "weight", "wait p50", "next wait", "next host")
    for name in cols:
        right = name not in ("pipeline", "next host")
        t.add_column(name, justify="right" if right else "left", no_wrap=True, min_width=len(name))
    rows = _get(doc, "pipelines")
    for p in rows if isinstance(rows, list) else []:
        share = _num(_get(p, "share"))
        t.add_row(
            plain(_get(p, "pipeline"), 64),
            fmt(_get(p, "queued"), "", 0),
            fmt(_get(p, "grants_last_minute"), "", 0),
            "-" if share is None else f"{100 * share:.0f}%",
            fmt(_get(p, "weight"), "", 1),
            fmt(_get(p, "wait_p50_s"), " s"),
            fmt(_get(p, "expected_wait_s"), " s"),
            plain(_get(p, "next_host")),
        )
    return t


def _workers(doc: Any) -> Table | None:
    """One row per worker of ``run --workers N`` (``workers`` of /status, observe/workermerge.py); None for
    a proxy of one process, whose document has no such list."""
    rows = _get(doc, "workers")
    if not isinstance(rows, list) or not rows:
        return None
    t = Table(title="workers (the lines above are their sum)", title_justify="left", expand=False)
    for name in ("worker", "state", "pid", "restarts", "up", "achieved", "grants", "queued", "exempt"):
        t.add_column(name, justify="left" if name == "state" else "right", no_wrap=True)
    for w in rows[:256]:  # a supervisor runs at most as many workers as cores; the list is not trusted
        up = _get(w, "answering") is True
        t.add_row(
            fmt(_get(w, "worker"), "", 0),
            Text("answering" if up else "NOT ANSWERING", style="" if up else "bold red"),
            fmt(_get(w, "pid"), "", 0),
            fmt(_get(w, "restarts"), "", 0),
            duration(_get(w, "uptime_s")),
            fmt(_get(w, "achieved_rate"), "/s"),
            fmt(_get(w, "grants_since_start"), "", 0),
            fmt(_get(w, "queued"), "", 0),
            fmt(_get(w, "exempt_in_flight"), "", 0),
        )
    return t


def _proxies(doc: Any) -> Table:
    """One row per live proxy sharing the store (``status --all``): the heartbeats' records."""
    t = Table(title="proxies sharing the store", title_justify="left", expand=False)
    for name in ("proxy", "listen", "version", "last beat", "up", "queued", "pipelines (queued)"):
        right = name in ("last beat", "up", "queued")
        t.add_column(name, justify="right" if right else "left", no_wrap=name != "pipelines (queued)")
    rows = _get(doc, "proxies")
    for p in rows if isinstance(rows, list) else []:
        pipes = _get(p, "pipelines")
        names = [f"{plain(_get(x, 'pipeline'), 64).plain} {fmt(_get(x, 'queued'), '', 0)}"
                 for x in (pipes if isinstance(pipes, list) else [])[:20]]  # fmt: skip
        more = _num(_get(p, "pipelines_omitted"))
        if more:
            names.append(f"+{more:.0f} more")
        t.add_row(
            plain(_get(p, "id"), 80).append(" (this one)" if _get(p, "self") is True else ""),
            plain(_get(p, "listen")),
            plain(_get(p, "version"), 20),
            fmt(_get(p, "last_beat_s"), " s", 1),
            duration(_get(p, "uptime_s")),
            fmt(_get(p, "queued"), "", 0),
            Text(", ".join(names) or "-"),
        )
    return t


def render(doc: Any, footer: str = "", all_proxies: bool = False) -> Group:
    """The whole view of one document; anything malformed shows as "-". ``all_proxies``: the proxies
    sharing the store, one row each, in place of this proxy's hosts, windows and pipelines."""
    o = _get(doc, "overall")
    st = _get(o, "store")
    conf = _num(_get(o, "configured_rate"))
    head = Text()
    head.append(f"politeproxy {plain(_get(doc, 'version'), 20).plain}", style="bold")
    head.append(f"  up {duration(_get(doc, 'uptime_s'))}  store ")
    head.append(plain(_get(st, "active"), 20).plain)
    if _get(st, "degraded") is True:
        head.append(" DEGRADED (local pacing)", style="bold red")
    cf = _get(doc, "config")  # the file read, or none: the defaults (issue 45)
    read = _get(cf, "read") is True
    head.append("\nconfig: " + (plain(_get(cf, "path"), 160).plain if read else "no config file (defaults)"))
    head.append("\nrate: configured " + (fmt(conf, "/s") if conf else "off"))
    window = fmt(_get(o, "achieved_window_s"), " s", 0)
    head.append(f"  achieved {fmt(_get(o, 'achieved_rate'), '/s')} (last {window})")
    head.append(f", {fmt(_get(o, 'achieved_rate_1m'), '/s')} (last minute)")
    head.append(f"  grants since start {fmt(_get(o, 'grants_since_start'), '', 0)}")
    head.append(f"  queued {fmt(_get(o, 'queued'), '', 0)}")
    head.append(f"  exempt in flight {fmt(_get(o, 'exempt_in_flight'), '', 0)}")
    cache = _get(o, "cache")
    rate = _num(_get(cache, "hit_rate"))
    head.append(
        f"\ncache: hit rate {fmt(rate * 100, '%', 0) if rate is not None else '-'}"
        f"  hits {fmt(_get(cache, 'hit'), '', 0)}  misses {fmt(_get(cache, 'miss'), '', 0)}"
        f"  slots saved {fmt(_get(cache, 'slots_saved'), '', 0)}"
        f"\nindex questions: kept {fmt(_get(cache, 'index_kept'), '', 0)}"
        f"  shared {fmt(_get(cache, 'index_shared'), '', 0)}  asked {fmt(_get(cache, 'index_asked'), '', 0)}"
    )
    hist = _get(doc, "history")
    spark = sparkline(_get(hist, "points"))
    head.append(f"\nachieved rate, last 15 min (one mark per {fmt(_get(hist, 'step_s'), ' s', 0)}): ")
    head.append(spark or "(collecting)", style="cyan")
    tables = [_proxies(doc)] if all_proxies else [_hosts(doc), _windows(doc), _pipelines(doc)]
    parts: list[Any] = [head, *tables]
    workers = _workers(doc)
    if workers is not None:
        parts.append(workers)
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)


def run(url: str, watch: bool = False, interval: float = DEFAULT_INTERVAL, as_json: bool = False,
        console: Console | None = None, all_proxies: bool = False) -> int:  # fmt: skip
    """Print the status once, or (``watch``) until Ctrl-C. Exit 1 with one line when the proxy does not
    answer the first time; later misses show in the view while it keeps asking."""
    # A pipe or a file gets 140 columns (rich's default there is 80), unless COLUMNS says otherwise.
    console = console or Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 140)
    err = Console(stderr=True)
    if not (math.isfinite(interval) and MIN_INTERVAL <= interval <= MAX_INTERVAL):
        err.print(
            Text(f"politeproxy: error: --interval must be {MIN_INTERVAL:g} to {MAX_INTERVAL:g} seconds")
        )
        return 2
    try:
        doc = fetch(url)
    except StatusError as e:
        err.print(Text(f"politeproxy: error: {e}"), soft_wrap=True)
        return 1
    if as_json and not watch:
        console.print_json(data=doc)
        return 0
    if not watch:
        console.print(render(doc, all_proxies=all_proxies))
        return 0
    try:
        _watch(url, doc, interval, console, all_proxies)
    except KeyboardInterrupt:
        pass
    return 0


def _watch(url: str, doc: dict[str, Any], interval: float, console: Console, every: bool = False) -> None:
    from rich.live import Live

    def frame(doc: dict[str, Any], miss: str = "") -> Group:
        stamp = time.strftime("%H:%M:%S")
        foot = f"{url}  every {interval:g} s  Ctrl-C quits  " + (
            f"NO ANSWER at {stamp}: {miss}" if miss else stamp
        )
        return render(doc, foot, every)

    if not console.is_terminal:  # a pipe or a file: one frame after another
        while True:
            console.print(frame(doc))
            time.sleep(interval)
            try:
                doc = fetch(url)
            except StatusError as e:
                console.print(Text(f"no answer: {e}"))
    with Live(frame(doc), console=console, screen=True, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            try:
                doc, miss = fetch(url), ""
            except StatusError as e:
                miss = str(e)
            live.update(frame(doc, miss), refresh=True)
