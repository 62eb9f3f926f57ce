"""What the proxy says when it starts, without -v: the pace of each class of host, and whether Redis answers.

A user who writes ``--global-rate 5`` (refused now) or ``"5s"`` sees at once what that means, as a gap
and as a rate, on the first lines of the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from politeproxy.config.storebuild import StartupError, StoreSet
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.hosts import HostSet
from politeproxy.policy.redis_url import redis_address
from politeproxy.policy.settings import format_duration, format_gap, format_rate
from politeproxy.policy.table import ScheduleSection
from politeproxy.proxy.door.ca import CAError, CertificateAuthority

log = logging.getLogger("politeproxy")
start_log = logging.getLogger("politeproxy.start")  # always at INFO (logs.setup_logging)

PROBE_TIMEOUT = 2.0


def pacing_lines(s: PacingSettings) -> list[str]:
    """One line per paced class of host: its gap and its rate, and the key that sets it."""
    lines = [f"pacing: all paced hosts together: one grant per {format_gap(s.gap)} (schedule.global_rate)"]
    for pattern, interval in s.host_intervals:
        if interval > 0:
            eff = max(s.gap, interval)
            lines.append(
                f"pacing: {pattern}: one grant per {format_gap(eff)} at most "
                f"(hosts.{pattern}.interval {format_duration(interval)}, within the global schedule)"
            )
    if s.exempt_rate > 0:
        lines.append(
            f"pacing: exempt range reads: at most {format_rate(s.exempt_rate)} per service, one per "
            f"{format_duration(s.exempt_rate)}, after a burst of {s.exempt_burst} (exempt.rate)"
        )
    else:
        lines.append("pacing: exempt range reads: no rate ceiling (exempt.rate = 0)")
    if s.window_limit > 0:
        lines.append(
            f"pacing: request window: at most {s.window_limit} requests per {format_duration(s.window)} per "
            f"service, every class together, counted for egress {s.egress!r} (egress.limit; Common Crawl "
            "blocks an IP above 6,000 in 300s)"
        )
    return lines


def window_warning(s: PacingSettings) -> str | None:
    """The warning for a request window turned off (egress.limit = 0), else None."""
    if s.window_limit > 0:
        return None
    return (
        "egress.limit = 0: the request window is off; nothing but the pace keeps this machine under Common "
        "Crawl's block rule (6,000 requests in 300 s per IP)"
    )


def announce_pacing(s: PacingSettings) -> None:
    for line in pacing_lines(s):
        start_log.info("%s", line)
    if (warning := window_warning(s)) is not None:
        log.warning("%s", warning)


def _scrub(text: str, url: str) -> str:
    """An error text for the log, with any password from ``url`` taken out and on one line."""
    from urllib.parse import urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        text = text.replace(password, "***")
    return " ".join(text.split())[:300]


async def probe_redis(client: Any, url: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """PING Redis once at start: one line naming its address (password masked), reachable or not.

    Never raises: an unreachable Redis is not fatal (the failover store paces locally until it answers),
    but the user hears of it now, not at the first request."""
    where = redis_address(url)
    try:
        async with asyncio.timeout(timeout):
            await client.ping()
    except Exception as e:  # noqa: BLE001 - any failure is reported, none stops the start
        log.warning(
            "redis at %s is unreachable (%s: %s); requests are paced on the local schedule "
            "(gap x schedule.expected_proxies) until it answers",
            where,
            type(e).__name__,
            _scrub(str(e) or "no answer", url),
        )
        return False
    start_log.info("redis at %s is reachable", where)
    return True


async def probe_store(stores: StoreSet, schedule: ScheduleSection) -> None:
    """The start-up probe of the redis backend: its client, when the store set has one."""
    if stores.redis is not None:
        await probe_redis(stores.redis, schedule.redis_url)


def config_view(path: str | None, read: bool) -> dict[str, Any]:
    """What /status says of the config file (issue 45): where it is looked for, and whether one was read."""
    return {"path": path, "read": read}


def config_line(path: str | None, read: bool) -> str:
    """The start line that names the config file read, or says that none was: the defaults apply."""
    if read:
        return f"config file: {path}"
    if path:
        return f"no config file: defaults (a file written at {path} is read when it appears)"
    return "no config file: defaults"


def _check_writable(data_dir: Path) -> None:
    """Create and remove a file: a read-only data dir is refused at start, not at the first CONNECT."""
    probe = data_dir / f".politeproxy-write-test-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    os.unlink(probe)


def open_data_dir(data_dir: Path, hosts: HostSet) -> CertificateAuthority:
    """Make the data dir, check it is writable, load (or make) the CA and the well-known leaves.

    Every failure is a one-line StartupError: an unwritable dir, a corrupt or unreadable CA file.
    Runs in a thread: it signs and writes files.
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        _check_writable(data_dir)
    except OSError as e:
        raise StartupError(f"data_dir {data_dir} is not a writable directory: {e.strerror}") from None
    try:
        ca = CertificateAuthority(data_dir, hosts.permitted_subtrees())
        if ca.created:
            log.warning("made a new CA in %s; trust %s (see `politeproxy env`)", data_dir, ca.cert_path)
        for h in hosts.concrete_hosts():
            ca.context_for(h)
    except CAError as e:
        raise StartupError(one_line(str(e))) from None
    except OSError as e:
        raise StartupError(f"the CA in {data_dir}: {e.filename or ''}: {e.strerror}") from None
    except ValueError as e:  # cryptography's parse errors, should the CA code let one through
        raise StartupError(f"the CA in {data_dir} cannot be read: {one_line(str(e))}") from None
    return ca


def one_line(text: str) -> str:
    return " ".join(text.split())[:300]
