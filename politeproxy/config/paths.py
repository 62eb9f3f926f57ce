"""Path values in the config (``data_dir``, ``upstream.ca_file``, ...) made absolute when the config loads.

``~`` and ``~user``, ``$VAR`` and ``${VAR}`` are expanded, and a relative path is joined to a base: the
config file's directory for a value from the file, the working directory for a flag or an environment
variable. So `politeproxy env` never prints a path that means something else in another directory,
and a daemon's files do not depend on where it was started.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from politeproxy.policy.settings import ConfigError

_VAR = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")
MAX_PATH = 4096


def resolve_path(value: str, key: str, base: Path, env: Mapping[str, str]) -> str:
    """``value`` as an absolute, normalised path ("" stays ""); a ConfigError naming ``key`` for an unset
    variable, an unknown ``~user``, a NUL byte or a path longer than MAX_PATH."""
    if not value:
        return value
    if "\0" in value or len(value) > MAX_PATH:
        raise ConfigError(f"{key}: not a usable path (a NUL byte, or longer than {MAX_PATH} characters)")

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise ConfigError(f"{key}: ${name} is not set (in {value[:200]!r})")
        return env[name]

    text = _VAR.sub(var, value)
    if text.startswith("~"):
        text = os.path.expanduser(text)
        if text.startswith("~"):
            raise ConfigError(f"{key}: cannot expand {text.split('/', 1)[0]!r} (no such user, or no HOME)")
    p = Path(text)
    if not p.is_absolute():
        p = base / p
    return os.path.normpath(os.path.abspath(p))


def resolve_paths(
    merged: dict[str, Any], keys: Iterable[tuple[str, ...]], base: Path, env: Mapping[str, str]
) -> None:
    """Resolve every path key (a tuple of table names and the key) of ``merged`` in place."""
    for path in keys:
        table = merged
        for name in path[:-1]:
            table = table.get(name) or {}
        if isinstance(table.get(path[-1]), str):
            table[path[-1]] = resolve_path(table[path[-1]], ".".join(path), base, env)
