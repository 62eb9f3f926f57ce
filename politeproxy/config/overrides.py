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
from politeproxy.policy.settings import ConfigError
from politeproxy.policy.table import SETTINGS, Setting
from politeproxy.policy.values import Conv, _str, _table_of, converter

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


# Values from outside the file that a kind reads differently there: a path is relative to the working
# directory, and [auth] users is one "name:password ..." string. Every other kind reads as in the file.
_OUTSIDE: dict[str, Conv] = {"path": _cwd_path, "users": parse_users}


def _origin(s: Setting) -> str:
    return " or ".join(x for x in (s.flag, s.env) if x)


# Every table entry with a flag or a variable, by its override name ("global_rate").
OVERRIDES: dict[str, Apply] = {
    s.override: _set(s.path, _OUTSIDE.get(s.kind) or converter(s), _origin(s))
    for s in SETTINGS
    if s.env or s.flag
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
    # The secrets have one, so that none has to live in the config file: the deploy files pass the
    # Redis password this way (from a secret); [auth] users likewise.
    return {s.override: env.get(s.env) or None for s in SETTINGS if s.env}
