"""The typed checks of config values (policy core, no I/O): each converter takes a raw TOML value and the
key it came from, and returns the value or raises a ConfigError that names the key. ``converter`` gives
the one for a table entry (policy/table.py) from its kind and bounds; config/loading.py builds the schema
from them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from politeproxy.policy.hosts import normalize_host, validate_pattern
from politeproxy.policy.redis_url import check_redis_url
from politeproxy.policy.settings import ConfigError, check_number, parse_duration, parse_size
from politeproxy.policy.table import Setting

Conv = Callable[[Any, str], Any]


def parse_hostport(value: str, key: str, default_port: int | None = None) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        if default_port is None:
            raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
        host, port = value, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    return host, int(port)


def _str(v: Any, key: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{key}: expected a string, got {type(v).__name__} {v!r}")
    return v


EGRESS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def egress_name(v: Any, key: str) -> str:
    """An egress name: a store key part, so letters, digits, ``.``, ``_`` and ``-`` only; empty = default."""
    name = _str(v, key)
    if name and not EGRESS_NAME.fullmatch(name):
        raise ConfigError(f"{key}: expected letters, digits, '.', '_' or '-' (at most 63), got {name!r}")
    return name


def _bool(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{key}: expected true or false, got {v!r}")
    return v


def _int(lo: int, hi: int) -> Callable[[Any, str], int]:
    def conv(v: Any, key: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{key}: expected an integer from {lo} to {hi}, got {v!r}")
        check_number(v, key, lo, hi)
        return v

    return conv


def _float(lo: float, hi: float) -> Callable[[Any, str], float]:
    def conv(v: Any, key: str) -> float:
        return check_number(v, key, lo, hi)

    return conv


def _dur(v: Any, key: str) -> float:
    return parse_duration(v, key)


def _choice(*choices: str) -> Callable[[Any, str], str]:
    def conv(v: Any, key: str) -> str:
        if v not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(map(repr, choices))}, got {v!r}")
        return str(v)

    return conv


def _list(item: Callable[[Any, str], Any]) -> Callable[[Any, str], list[Any]]:
    def conv(v: Any, key: str) -> list[Any]:
        if not isinstance(v, list):
            raise ConfigError(f"{key}: expected a list, got {type(v).__name__} {v!r}")
        return [item(x, f"{key}[{i}]") for i, x in enumerate(v)]

    return conv


def _table_of(item: Callable[[Any, str], Any]) -> Callable[[Any, str], dict[str, Any]]:
    def conv(v: Any, key: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise ConfigError(f"{key}: expected a table, got {type(v).__name__} {v!r}")
        return {str(k): item(x, f"{key}.{k}") for k, x in v.items()}

    return conv


def _cidr(v: Any, key: str) -> str:
    s = _str(v, key)
    try:
        ipaddress.ip_network(s, strict=False)
    except ValueError:
        raise ConfigError(f'{key}: expected a CIDR such as "10.0.0.0/8", got {v!r}') from None
    return s


def _pattern(v: Any, key: str) -> str:
    s = _str(v, key)
    err = validate_pattern(s)
    if err:
        raise ConfigError(f"{key}: {err}")
    return normalize_host(s)


def _hostport(v: Any, key: str) -> str:
    s = _str(v, key)
    parse_hostport(s, key)
    return s


def _optional_hostport(v: Any, key: str) -> str:
    s = _str(v, key)
    if s:
        parse_hostport(s, key)
    return s


def _status(v: Any, key: str) -> int:
    return _int(100, 599)(v, key)


def _method(v: Any, key: str) -> str:
    return _str(v, key).upper()


def _count_or_auto(lo: int, hi: int) -> Callable[[Any, str], int | str]:
    """A number of processes, or ``"auto"`` (one per core: the command resolves it, the policy reads no
    machine). A flag's value arrives as a string of digits."""

    def conv(v: Any, key: str) -> int | str:
        if v == "auto":
            return "auto"
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f'{key}: expected an integer from {lo} to {hi} or "auto", got {v!r}')
        return _int(lo, hi)(v, key)

    return conv


def _bounded(make: Callable[[Any, Any], Conv]) -> Callable[[Setting], Conv]:
    def conv(s: Setting) -> Conv:
        assert s.bounds is not None, f"{s.key}: kind {s.kind} needs bounds"
        return make(*s.bounds)

    return conv


# kind -> the converter of a table entry of that kind. The nested tables ("exempt rules", "cache rules")
# are config/loading.py's, since they are checked with the schema machinery.
CONVERTERS: dict[str, Callable[[Setting], Conv]] = {
    "duration": lambda s: _dur,  # bounds: settings.DURATION_BOUNDS, from the same table
    "rate": lambda s: _dur,
    "int": _bounded(_int),
    "count or auto": _bounded(_count_or_auto),
    "float": _bounded(_float),
    "bool": lambda s: _bool,
    "string": lambda s: _str,
    "egress name": lambda s: egress_name,
    "path": lambda s: _str,  # made absolute by config/paths.py when the config loads
    "choice": lambda s: _choice(*s.choices),
    "size": lambda s: parse_size,
    "host:port": lambda s: _hostport,
    "host:port or empty": lambda s: _optional_hostport,
    "redis url": lambda s: check_redis_url,
    "cidr list": lambda s: _list(_cidr),
    "host patterns": lambda s: _list(_pattern),
    "names": lambda s: _list(_str),
    "ports": lambda s: _list(_bounded(_int)(s)),
    "status codes": lambda s: _list(_status),
    "users": lambda s: _table_of(_str),
    "resolve table": lambda s: _table_of(_hostport),
}


def converter(s: Setting) -> Conv:
    """The converter of a table entry, from its kind (a KeyError names a kind nobody reads)."""
    return CONVERTERS[s.kind](s)
