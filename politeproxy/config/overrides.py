"""Config values from outside the file: POLITEPROXY_* environment variables and command-line flags.

Both win over the config file (flags over the environment), and a reload applies them again. Every
key that holds a secret has a variable, so no password has to live in a file others can read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from politeproxy.config.paths import resolve_path
from politeproxy.policy.redis_url import check_redis_url
from politeproxy.policy.settings import ConfigError, parse_duration
from politeproxy.policy.values import _choice, _hostport, _optional_hostport, _str, _table_of

Apply = Callable[[dict[str, Any], Any], None]


def parse_users(value: Any, key: str) -> dict[str, str]:
    """``[auth] users`` from POLITEPROXY_AUTH_USERS: "name:password" entries separated by commas or
    white space (so a password given there has neither). An error never shows a password."""
    if not isinstance(value, str):
        return _table_of(_str)(value, key)
    users: dict[str, str] = {}
    for i, entry in enumerate(value.replace(",", " ").split()):
        name, sep, password = entry.partition(":")
        if not (name and sep and password):
            raise ConfigError(f"{key}: entry {i + 1} is not name:password (names and passwords non-empty)")
        users[name] = password
    if not users:
        raise ConfigError(f"{key}: no name:password entries")
    return users


def _cwd_path(value: Any, key: str) -> str:
    """A path from a flag or the environment: relative to the working directory."""
    return resolve_path(_str(value, key), key, Path.cwd(), os.environ)


def _set(path: tuple[str, ...], conv: Callable[[Any, str], Any], origin: str = "") -> Apply:
    """Set the key at ``path``; an error names the key, then where the value came from."""
    key = ".".join(path)

    def apply(merged: dict[str, Any], value: Any) -> None:
        table = merged
        for name in path[:-1]:
            table = table[name]
        try:
            table[path[-1]] = conv(value, key)
        except ConfigError as e:
            raise ConfigError(f"{e} (from {origin})" if origin else str(e)) from None

    return apply


OVERRIDES: dict[str, Apply] = {
    "listen": _set(("listen",), _hostport, "--listen or POLITEPROXY_LISTEN"),
    "data_dir": _set(("data_dir",), _cwd_path, "--data-dir or POLITEPROXY_DATA_DIR"),
    "global_rate": _set(
        ("schedule", "global_rate"), parse_duration, "--global-rate or POLITEPROXY_GLOBAL_RATE"
    ),
    "metrics_listen": _set(("metrics_listen",), _optional_hostport, "--metrics-listen"),
    "redis_url": _set(("schedule", "redis_url"), check_redis_url, "POLITEPROXY_REDIS_URL"),
    "auth_users": _set(("auth", "users"), parse_users, "POLITEPROXY_AUTH_USERS"),
    "log_format": _set(("log_format",), _choice("plain", "json"), "--log-format"),
}


def apply_overrides(merged: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Apply every override that is not None to the validated config ``merged``, in place."""
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in OVERRIDES:
            raise ConfigError(f"{key}: not an override")
        OVERRIDES[key](merged, value)


def env_overrides(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The POLITEPROXY_* variables that set config keys; unset or empty ones are None (no override)."""
    return {
        "listen": env.get("POLITEPROXY_LISTEN") or None,
        "data_dir": env.get("POLITEPROXY_DATA_DIR") or None,
        "global_rate": env.get("POLITEPROXY_GLOBAL_RATE") or None,
        # Secrets, so that none has to live in the config file: the deploy files pass the Redis
        # password this way (from a secret); [auth] users likewise.
        "redis_url": env.get("POLITEPROXY_REDIS_URL") or None,
        "auth_users": env.get("POLITEPROXY_AUTH_USERS") or None,
    }
