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
from dataclasses import dataclass
from typing import Any

from politeproxy.policy.table import DAY, SETTINGS, SIZE_BOUNDS, default, setting


class ConfigError(ValueError):
    """A config value, flag or environment variable is invalid; the message is one line naming it."""


def bounds_of(key: str) -> tuple[Any, Any]:
    """The (lowest, highest) of a key with bounds in the table."""
    b = setting(key).bounds
    assert b is not None, key
    return b


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


# -- defaults: named views of the table (policy/table.py), THE one home of every default -------------
# The dataclasses (PacingSettings, BackoffPolicy, Timeouts, Upstream, RobotsWatcher) read these names;
# tests/unit/policy/test_settings_defaults.py checks that they agree with what the config loads.

LISTEN: str = default("listen")
LOG_FORMAT: str = default("log_format")
TUNNEL_PORTS: tuple[int, ...] = default("tunnel_ports")
ALLOW_PRIVATE_DESTINATIONS: bool = default("allow_private_destinations")
INTERCEPT_S3_PATH_STYLE: bool = default("intercept_s3_path_style")
# [client]
HANDSHAKE_TIMEOUT: float = default("client.handshake_timeout")
HEADER_TIMEOUT: float = default("client.header_timeout")
IDLE_TIMEOUT: float = default("client.idle_timeout")
MAX_HEADER_SIZE: int = default("client.max_header_size")
MAX_CLIENT_CONNECTIONS: int = default("client.max_connections")
# [upstream]
CONNECT_TIMEOUT: float = default("upstream.connect_timeout")
READ_TIMEOUT: float = default("upstream.read_timeout")
UPSTREAM_MAX_CONNECTIONS: int = default("upstream.max_connections")
# [schedule]
BACKEND: str = default("schedule.backend")
GLOBAL_GAP: float = default("schedule.global_rate")  # seconds between paced grants: 5 req/s
REDIS_URL: str = default("schedule.redis_url")
REDIS_PREFIX: str = default("schedule.redis_prefix")
REDIS_KEY_TTL: float = default("schedule.redis_key_ttl")
EXPECTED_PROXIES: int = default("schedule.expected_proxies")
# [pacing]
MAX_WAIT: float = default("pacing.max_wait")  # under duckdb's and cdx_toolkit's 30 s timeouts
RETRIES: int = default("pacing.retries")
MAX_QUEUE: int = default("pacing.max_queue")  # paced lines plus exempt places together
BACKOFF_BASE: float = default("pacing.backoff_base")
BACKOFF_FACTOR = 2.0  # not a config key
BACKOFF_CAP: float = default("pacing.backoff_cap")
BACKOFF_JITTER: float = default("pacing.backoff_jitter")
# Per-code policies (issue 12): 429/500/503 back off exponentially; a 403 (CloudFront's rate rule) holds the
# host for BLOCK_HOLD, doubling per consecutive block up to BLOCK_HOLD_CAP, then one probe goes alone.
THROTTLE_CODES: tuple[int, ...] = default("pacing.throttle_codes")
BLOCK_CODES: tuple[int, ...] = default("pacing.block_codes")
BLOCK_HOLD: float = default("pacing.block_hold")
BLOCK_HOLD_CAP: float = default("pacing.block_hold_cap")
# The adaptive host interval: at least doubled by a throttle (never below the floor), back to the
# configured one in 4 steps over ADAPTIVE_RECOVERY from the end of the backoff.
ADAPTIVE: bool = default("pacing.adaptive")
ADAPTIVE_FLOOR: float = default("pacing.adaptive_floor")
ADAPTIVE_RECOVERY: float = default("pacing.adaptive_recovery")
# [hosts]: index.commoncrawl.org is one fragile pywb server; cdx_toolkit paces it at 1 s. The default
# [hosts] table is not a key's default: it is what a config without [hosts] gets.
INDEX_HOST_INTERVAL = 1.0
HOST_INTERVALS: tuple[tuple[str, float], ...] = (("index.commoncrawl.org", INDEX_HOST_INTERVAL),)
# [exempt]
EXEMPT_MAX_IN_FLIGHT: int = default("exempt.max_in_flight")
EXEMPT_RESPECT_BACKOFF: bool = default("exempt.respect_backoff")
EXEMPT_RATE: float = default("exempt.rate")  # 50/s per service, shared by every proxy on the store
EXEMPT_BURST: int = default("exempt.burst")
EXEMPT_BURST_BOUNDS = bounds_of("exempt.burst")
# [pipelines.NAME]: a pipeline's weight in the fair queue, and its own cap on requests waiting (0 = none)
PIPELINE_WEIGHT: float = default("pipelines.*.weight")
PIPELINE_WEIGHT_BOUNDS = bounds_of("pipelines.*.weight")
PIPELINE_MAX_QUEUED: int = default("pipelines.*.max_queued")
PIPELINE_MAX_QUEUED_BOUNDS = bounds_of("pipelines.*.max_queued")
MAX_PIPELINES = 256  # configured [pipelines.*] tables at most (each keeps a metric label for good)
# [robots]
ROBOTS_ENABLED: bool = default("robots.enabled")
ROBOTS_TTL: float = default("robots.ttl")
ROBOTS_MAX_CRAWL_DELAY: float = default("robots.max_crawl_delay")
# [cache] (issue 14): the shared disk cache of immutable Common Crawl objects, in <data_dir>/cache
CACHE_ENABLED: bool = default("cache.enabled")
CACHE_MAX_OBJECT: int = default("cache.max_object")
CACHE_MAX_RANGE: int = default("cache.max_range")
CACHE_MAX_SIZE: int = default("cache.max_size")
CACHE_COLLINFO_TTL: float = default("cache.collinfo_ttl")  # collinfo.json changes once a month
CACHE_INDEX_ANSWERS: bool = default("cache.index_answers")  # issue 43: CDX answers of published crawls
CACHE_INDEX_MISS_TTL: float = default("cache.index_miss_ttl")
CACHE_INDEX_REDIS_MAX_ANSWER: int = default("cache.index_redis_max_answer")
CACHE_INDEX_REDIS_MAX_SIZE: int = default("cache.index_redis_max_size")
INDEX_REST: float = default("pacing.index_rest")  # issue 43: the index service rests after a warning


@dataclass(frozen=True, slots=True)
class RobotsSettings:
    """What the robots watcher reads: its typed settings, applied at start and by a reload."""

    enabled: bool = ROBOTS_ENABLED
    ttl: float = ROBOTS_TTL
    max_crawl_delay: float = ROBOTS_MAX_CRAWL_DELAY


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
