"""The bounds of every duration and number the proxy reads from a config file, a flag or the environment.

One validator, ``check_number``, is the only way a number gets in: it refuses NaN, infinities, negative
values and values beyond the key's bound, with one line naming the key. ``float("nan")`` is a valid
float that makes every ``gap > 0`` test false, so an unchecked NaN switches pacing off.

Durations need a unit ("200ms", "1.5s"); keys that space grants also take a rate ("5/s" = a 200 ms gap).
A bare number other than 0 is refused with a hint, since "5" could mean either (``parse_duration``).

Policy core: no I/O. Environment values are passed in as a mapping.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from typing import Any

from politeproxy.policy.table import DAY, SETTINGS, SIZE_BOUNDS, RobotsSection, Sections, setting


class ConfigError(ValueError):
    """A config value, flag or environment variable is invalid; the message is one line naming it."""


# (lowest, highest) per duration key, in seconds, from the table. The upper bounds are far above any
# sensible value and exist so that a typo ("1e9") cannot park the proxy for years.
DURATION_BOUNDS: dict[str, tuple[float, float]] = {
    s.key: (float(s.bounds[0]), float(s.bounds[1]))
    for s in SETTINGS
    if s.kind in ("duration", "rate") and s.bounds is not None
}
# The fallback for a duration key not listed above ([[cache.rules]] ttl).
DEFAULT_DURATION_BOUNDS = (0.0, DAY)

# Environment variables that hold numbers: (lowest, highest, default).
ENV_NUMBERS: dict[str, tuple[float, float, float]] = {
    # A testing aid for clock skew between proxies; a week either way is already absurd.
    "POLITEPROXY_CLOCK_OFFSET": (-7 * DAY, 7 * DAY, 0.0),
    # The achieved-rate gauge's window (metrics.py).
    "POLITEPROXY_RATE_WINDOW": (1.0, DAY, 60.0),
}


# -- defaults -------------------------------------------------------------------------------------------
# Every default lives in the table (policy/table.py): ``DEFAULTS`` is its typed view, one section per TOML
# section (``DEFAULTS.client.idle_timeout``); the parts' own settings dataclasses take theirs with
# ``from_table``. tests/unit/policy/test_settings_defaults.py finds any literal that repeats one.
DEFAULTS = Sections()
LISTEN: str = DEFAULTS.general.listen  # the Config's listen before a file is read
MAX_PIPELINES = 256  # configured [pipelines.*] tables at most (each keeps a metric label for good)
# The parts handed these as keyword defaults (proxy/listener.py, proxy/origin/upstream.py,
# proxy/forwarding/robots_fetch.py) read them by these names until they take their sections; App passes every
# value from the loaded sections.
HANDSHAKE_TIMEOUT: float = DEFAULTS.client.handshake_timeout
HEADER_TIMEOUT: float = DEFAULTS.client.header_timeout
IDLE_TIMEOUT: float = DEFAULTS.client.idle_timeout
MAX_HEADER_SIZE: int = DEFAULTS.client.max_header_size
MAX_CLIENT_CONNECTIONS: int = DEFAULTS.client.max_connections
CONNECT_TIMEOUT: float = DEFAULTS.upstream.connect_timeout
READ_TIMEOUT: float = DEFAULTS.upstream.read_timeout
UPSTREAM_MAX_CONNECTIONS: int = DEFAULTS.upstream.max_connections
ROBOTS_ENABLED: bool = DEFAULTS.robots.enabled
ROBOTS_TTL: float = DEFAULTS.robots.ttl
ROBOTS_MAX_CRAWL_DELAY: float = DEFAULTS.robots.max_crawl_delay
# What the robots watcher reads, applied at start and by a reload: the [robots] section itself.
RobotsSettings = RobotsSection


def check_number(value: float, key: str, lo: float = 0.0, hi: float = DAY, unit: str = "") -> float:
    """``value`` as a float when finite and within [lo, hi]; else a ConfigError naming ``key``.

    Every duration and number from a config file, a flag or the environment passes through here.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: expected a number, got {shown(value)}")
    try:
        f = float(value)
    except OverflowError:  # an int too large for a float
        raise ConfigError(f"{key}: expected a finite number, got a number too large") from None
    if not math.isfinite(f):
        raise ConfigError(f"{key}: expected a finite number, got {f!r}")
    if not lo <= f <= hi:
        raise ConfigError(f"{key}: expected a value from {lo:g}{unit} to {hi:g}{unit}, got {value:g}{unit}")
    return f


def shown(value: Any) -> str:
    """A value for an error line: its repr, cut short (a line names the key; it is not a dump)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a number too large"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def duration_bounds(key: str) -> tuple[float, float]:
    """The bounds of a duration key; ``hosts.<pattern>.interval`` keys share one entry."""
    if key.startswith("hosts.") and key.endswith(".interval"):
        return DURATION_BOUNDS["hosts.*.interval"]
    return DURATION_BOUNDS.get(key, DEFAULT_DURATION_BOUNDS)


# ASCII digits only: ``\d`` and float() also accept other scripts' digits, "1_0", "nan" and "inf".
_NUMBER = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")
_PART = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,15})?)(ms|us|s|m|h)")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# A rate: N per second, minute or hour ("5/s", "300/m", "1/h"), read as the gap 1/N of that unit.
_RATE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,15})?) ?/ ?(s|sec|m|min|h|hour)")
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}
_DURATION_HELP = 'expected a duration such as "200ms", "1.5s" or "5m"'
_RATE_HELP = 'expected a gap such as "200ms" or a rate such as "5/s" or "300/m"'

# The keys that space grants (kind "rate" in the table): they take a rate ("5/s" = one grant per 200 ms)
# as well as a gap. Every other duration key is a timeout or a hold and takes a duration only.
RATE_KEYS = tuple(s.key for s in SETTINGS if s.kind == "rate")


def accepts_rate(key: str) -> bool:
    """True for a key that spaces grants (see RATE_KEYS), so a rate means its gap."""
    return key in RATE_KEYS or (key.startswith("hosts.") and key.endswith(".interval"))


def _bare(shown_number: str, key: str) -> ConfigError:
    """A bare number other than 0: "5" could mean 5/s or one slot per 5 s, so it is refused with both."""
    n = shown_number
    if accepts_rate(key):
        return ConfigError(f"{key}: bare number {n}: write {n}/s for a rate or {n}s for a gap")
    return ConfigError(f"{key}: bare number {n}: write {n}s (a duration needs a unit: ms, s, m or h)")


def _rate_gap(m: re.Match[str], key: str) -> float:
    if not accepts_rate(key):
        raise ConfigError(f"{key}: {_DURATION_HELP} (a rate such as {m.group(0)!r} fits only rate keys)")
    n = float(m.group(1))
    if n == 0:
        raise ConfigError(f'{key}: a rate of 0 never grants; write "0" to turn this pacing off')
    return _RATE_UNITS[m.group(2)] / n


def _duration_seconds(value: Any, key: str) -> float:
    help_ = _RATE_HELP if accepts_rate(key) else _DURATION_HELP
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{key}: {help_}, got {shown(value)}")
    if not isinstance(value, str):
        f = check_number(value, key, -math.inf, math.inf)  # finite; the bounds follow
        if f > 0:
            raise _bare(f"{f:g}", key)
        return f or 0.0  # 0 (off, never -0.0), or negative for the bounds check to refuse
    v = value.strip().lower()
    if v == "off":
        return 0.0
    if _NUMBER.fullmatch(v):
        if float(v) != 0:
            raise _bare(v, key)
        return 0.0
    m = _RATE.fullmatch(v)
    if m:
        return _rate_gap(m, key)
    pos, total = 0, 0.0
    for m in _PART.finditer(v):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == len(v) and pos > 0:
        return total
    raise ConfigError(f"{key}: {help_}, got {shown(value)}")


def parse_duration(value: Any, key: str = "duration") -> float:
    """Seconds from a string like "200ms", "1.5s", "5m", "1m30s", "0" or "off"; for a rate key (see
    RATE_KEYS) also a rate, "5/s", "300/m" or "1/h", read as its gap (5/s is 0.2 s between grants).

    A bare number other than 0 (TOML ``5`` or the string "5") is refused with a hint: for a rate key it
    could mean 5/s or 5 s. The result is finite and within the key's bounds (``duration_bounds``);
    anything else is a ConfigError naming the key, never another exception.
    """
    lo, hi = duration_bounds(key)
    return check_number(_duration_seconds(value, key), key, lo, hi, unit=" s")


def _num(x: float) -> str:
    """Four significant digits, never in exponent form (the config parser reads no exponents)."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.4g}" if x >= 1e-4 else f"{x:.6f}"


def format_duration(seconds: float) -> str:
    """A duration as the config would write it: "200ms", "1.5s", "2m", "1h"."""
    if seconds < 1e-3:
        return f"{_num(seconds * 1e6)}us"
    if seconds < 1:
        return f"{_num(seconds * 1000)}ms"
    if seconds < 120 or seconds % 60:
        return f"{_num(seconds)}s"
    if seconds < 7200 or seconds % 3600:
        return f"{_num(seconds / 60)}m"
    return f"{_num(seconds / 3600)}h"


def format_rate(gap: float) -> str:
    """The rate a gap allows, in the unit that keeps the number at least 1: "5/s", "2/m", "1/h"."""
    for unit, span in (("s", 1.0), ("m", 60.0)):
        if span / gap >= 1:
            return f"{_num(span / gap)}/{unit}"
    return f"{_num(3600.0 / gap)}/h"


def format_utc(t: float) -> str:
    """A wall-clock time as the logs, refusals and status lines write it: ``2026-12-07T08:00:00Z``."""
    return dt.datetime.fromtimestamp(math.floor(t), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_gap(gap: float) -> str:
    """How the proxy shows a gap back: "200ms (5/s)"; "off" for 0."""
    if not gap > 0:
        return "off"
    return f"{format_duration(gap)} ({format_rate(gap)})"


_SIZE = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?) ?(b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)?")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: Any, key: str = "size", lo: int = SIZE_BOUNDS[0], hi: int = SIZE_BOUNDS[1]) -> int:
    """Bytes from an int or a string like "64MiB", "2GiB", "512k", "1.5G" (binary units: k = KiB).

    Within [lo, hi]; anything else (NaN, negative, "1e9", other scripts' digits) is a ConfigError naming
    the key, never another exception.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f'{key}: expected a size such as "64MiB" or a number of bytes, got {shown(value)}')
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE.fullmatch(value.strip().lower())
        if m is None:
            raise ConfigError(f'{key}: expected a size such as "64MiB", "2GiB" or "512k", got {shown(value)}')
        n = int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "")[:1]])
    if not lo <= n <= hi:
        raise ConfigError(f"{key}: expected a size from {lo} to {hi} bytes, got {shown(n)}")
    return n


def parse_number(value: Any, key: str, lo: float, hi: float) -> float:
    """A plain number (int, float or a decimal string such as "60" or "-5.5") within [lo, hi]."""
    if isinstance(value, str):
        v = value.strip()
        body = v[1:] if v[:1] in "+-" else v
        if not _NUMBER.fullmatch(body):
            raise ConfigError(f"{key}: expected a number, got {shown(value)}")
        value = float(v)
    return check_number(value, key, lo, hi)


def env_number(env: Mapping[str, str], name: str) -> float:
    """The value of a numeric environment variable (see ENV_NUMBERS), its default when unset or empty."""
    lo, hi, default = ENV_NUMBERS[name]
    raw = env.get(name, "")
    if not raw.strip():
        return default
    return parse_number(raw, name, lo, hi)


def check_environment(env: Mapping[str, str]) -> None:
    """Raise a ConfigError for the first invalid numeric environment variable."""
    for name in ENV_NUMBERS:
        env_number(env, name)


# Values never written to the log on reload: passwords, and URLs that may carry one.
_HIDDEN = ("auth.", "schedule.redis_url")


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every key a reload changed (secrets shown as changed, never their value)."""
    a, b = _flat(old), _flat(new)
    out = []
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key):
            hidden = key.startswith(_HIDDEN)
            out.append(
                f"{key} changed"
                if hidden
                else f"{key}: {in_units(key, a.get(key))} -> {in_units(key, b.get(key))}"
            )
    return out


_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_size(n: int) -> str:
    """A size as the config would write it: "64MiB"; plain bytes when no binary unit divides it."""
    for unit, size in _BINARY:
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def in_units(key: str, value: Any) -> str:
    """A validated value as the config file writes it (issue 45): a duration "200ms", a rate "200ms (5/s)",
    a size "64MiB"; any other value, or a key the table does not know, as Python shows it."""
    try:
        kind = setting(key).kind
    except KeyError:
        return repr(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return repr(value)
    if kind == "rate":
        return format_gap(value)
    if kind == "duration":
        return format_duration(value) if value > 0 else "0s"
    if kind == "size" and isinstance(value, int):
        return format_size(value)
    return repr(value)
