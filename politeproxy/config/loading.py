"""The config file (TOML): defaults, validation and environment overrides.

Every key is declared once, in the table of settings (policy/table.py); ``SCHEMA`` is built from it, and
an unknown key or a wrong type is a ``ConfigError`` naming the key and what was expected.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from politeproxy.config import parts
from politeproxy.config.overrides import apply_overrides, env_overrides
from politeproxy.config.parts import egress_default
from politeproxy.config.paths import resolve_paths
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.cacherules import CacheLimits
from politeproxy.policy.classify import ExemptRule
from politeproxy.policy.clients import MAX_RULES as MAX_CLIENT_RULES
from politeproxy.policy.clients import ClientRule
from politeproxy.policy.fairness import PipelineRule, clean_name
from politeproxy.policy.settings import (
    LISTEN,
    MAX_PIPELINES,
    ConfigError,
    changes,
    check_environment,
    env_number,
    parse_duration,
)
from politeproxy.policy.table import (
    SETTINGS,
    RobotsSection,
    Sections,
    Setting,
    default,
    restart_only,
    sections_from,
    setting,
)
from politeproxy.policy.values import (
    Conv,
    _bool,
    _dur,
    _list,
    _method,
    _pattern,
    _str,
    converter,
    parse_hostport,
)

__all__ = [
    "ConfigError",
    "parse_hostport",
    "check_environment",
    "changes",
    "env_number",
    "parse_duration",
    "load",
    "build",
    "Config",
    "env_overrides",
    "egress_default",
]


MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KiB; this refuses a wrong path to a huge file


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "politeproxy"


_RULE = {
    "host": (_pattern, "*.commoncrawl.org"),
    "path": (_str, "/cc-index/table/"),
    "range_required": (_bool, True),
    "methods": (_list(_method), ["GET", "HEAD"]),
}


def _rules(v: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise ConfigError(f"{key}: expected an array of tables [[exempt.rules]], got {v!r}")
    return [_section(r, _RULE, f"{key}[{i}]") for i, r in enumerate(v)]


_CACHE_RULE = {
    "class": (_str, "data"),
    "hosts": (_list(_pattern), []),
    "paths": (_list(_str), []),
    "exact": (_bool, False),
    "ttl": (_dur, 0.0),
    "ranges": (_bool, True),
}


# A rule without max_wait holds its clients as long as pacing.max_wait's default.
_CLIENT_RULE = {"user_agent": (_str, ""), "max_wait": (_dur, default("pacing.max_wait"))}


def _client_rules(v: Any, key: str) -> list[dict[str, Any]]:
    """``[[clients.rules]]``: each a non-empty User-Agent prefix and a hold bound within pacing.max_wait's."""
    if not isinstance(v, list) or len(v) > MAX_CLIENT_RULES:
        raise ConfigError(f"{key}: expected an array of at most {MAX_CLIENT_RULES} tables [[clients.rules]]")
    out = [_section(r, _CLIENT_RULE, f"{key}[{i}]") for i, r in enumerate(v)]
    lo, hi = setting("pacing.max_wait").bounds or (0.0, 3600.0)
    for i, r in enumerate(out):
        ua = r["user_agent"]
        if not ua or len(ua) > 256 or not ua.isprintable():
            raise ConfigError(f"{key}[{i}].user_agent: expected 1-256 printable characters, got {ua!r}")
        if not lo <= r["max_wait"] <= hi:
            raise ConfigError(f"{key}[{i}].max_wait: expected a duration from {lo:g}s to {hi:g}s")
    return out


def _cache_rules(v: Any, key: str) -> list[dict[str, Any]]:
    """``[[cache.rules]]`` replace the default table (issue 14): each needs hosts and paths."""
    if not isinstance(v, list) or len(v) > 64:
        raise ConfigError(f"{key}: expected an array of at most 64 tables [[cache.rules]], got {v!r}")
    out = [_section(r, _CACHE_RULE, f"{key}[{i}]") for i, r in enumerate(v)]
    for i, r in enumerate(out):
        if not r["hosts"] or not r["paths"] or not all(p.startswith("/") for p in r["paths"]):
            raise ConfigError(f"{key}[{i}]: needs hosts and paths (each path starting with /)")
    return out


def _pipelines(v: Any, key: str) -> dict[str, dict[str, Any]]:
    """``[pipelines.NAME]`` tables: NAME as a client sends it (printable, no spaces or quotes)."""
    if not isinstance(v, dict):
        raise ConfigError(f"{key}: expected a table of pipeline names, got {v!r}")
    if len(v) > MAX_PIPELINES:
        raise ConfigError(f"{key}: at most {MAX_PIPELINES} pipelines, got {len(v)}")
    for name in v:
        if not name or clean_name(name) != name:
            raise ConfigError(
                f"{key}.{name!r}: a pipeline name is 1-64 printable characters, no spaces or quotes"
            )
    return {name: _section(t, _ITEMS["pipelines"], f"{key}.{name}") for name, t in v.items()}


def _hosts(v: Any, key: str) -> dict[str, dict[str, Any]]:
    if not isinstance(v, dict):
        raise ConfigError(f"{key}: expected a table of host patterns, got {v!r}")
    return {_pattern(h, f"{key}.{h}"): _section(t, _ITEMS["hosts"], f"{key}.{h}") for h, t in v.items()}


def _users(v: Any, key: str) -> dict[str, str]:
    """``[auth] users``: ``name = "password"``. An error names the key and the type, never the value:
    it is a password, and the error line goes to a terminal and a log."""
    if not isinstance(v, dict):
        raise ConfigError(f'{key}: expected a table of name = "password", got {type(v).__name__} (not shown)')
    for name, password in v.items():
        if not isinstance(password, str):
            kind = type(password).__name__
            raise ConfigError(f"{key}.{name}: expected a password string, got {kind} (not shown)")
    return {str(k): p for k, p in v.items()}


# The kinds of nested tables, checked with the schema machinery below; every other kind's converter is
# policy/values.py's ([auth] users is here for its errors, which never show a value).
_NESTED: dict[str, Conv] = {
    "exempt rules": _rules,
    "cache rules": _cache_rules,
    "client rules": _client_rules,
    "users": _users,
}
# Tables keyed by a name ("hosts.*.interval"): the table's converter and its value when absent.
_BY_NAME: dict[str, tuple[Conv, Any]] = {"hosts": (_hosts, None), "pipelines": (_pipelines, {})}


def _schema(settings: Iterable[Setting] = SETTINGS) -> dict[str, Any]:
    """The TOML schema, from the table of settings: nested dicts of (converter, default) per key."""
    schema: dict[str, Any] = {}
    for s in settings:
        *tables, name = s.path
        spec = (_NESTED.get(s.kind) or converter(s), s.default)
        if "*" in tables:  # one key of every [hosts."<pattern>"] table
            _ITEMS.setdefault(tables[0], {})[name] = spec
            schema[tables[0]] = _BY_NAME[tables[0]]
            continue
        where = schema
        for t in tables:
            where = where.setdefault(t, {})
        where[name] = spec
    return schema


# The schema of one [hosts.X] or [pipelines.X] table.
_ITEMS: dict[str, dict[str, Any]] = {}
SCHEMA: dict[str, Any] = _schema()


def _fresh(default: Any) -> Any:
    """A default as a loaded value: tuples in the table stand for lists; never a shared dict or list."""
    if isinstance(default, tuple):
        return list(default)
    return dict(default) if isinstance(default, dict) else default


def _section(raw: Any, schema: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a table, got {raw!r}")
    out: dict[str, Any] = {}
    for key in raw:
        if key not in schema:
            where = f"{prefix}.{key}" if prefix else key
            known = ", ".join(sorted(schema))
            raise ConfigError(f"{where}: unknown key (known here: {known})")
    for key, spec in schema.items():
        where = f"{prefix}.{key}" if prefix else key
        if isinstance(spec, dict):
            out[key] = _section(raw.get(key, {}), spec, where)
        else:
            conv, default = spec
            out[key] = conv(raw[key], where) if key in raw else _fresh(default)
    return out


@dataclass(frozen=True)
class Config:
    """One loaded config: its typed ``sections`` (what every part is handed) and the validated tree they were
    built from (``raw``: the reload's diff, ``get``). Outside config/ the package reads ``sections`` only."""

    raw: dict[str, Any]
    source: str = "<defaults>"
    listen: tuple[str, int] = parse_hostport(LISTEN, "listen")
    data_dir: Path = field(default_factory=default_data_dir)
    sections: Sections = field(default_factory=Sections)

    def __getitem__(self, section: str) -> Any:
        """The validated tree of one section; config/'s own (storebuild.py), never a part's."""
        return self.raw[section]

    def get(self, key: str) -> Any:
        """The value of a dotted key of the table ("schedule.global_rate"); a KeyError for a key the table
        does not declare (a typo fails at once), None for a [hosts] or [pipelines] name not configured."""
        setting(key)
        value: Any = self.raw
        for name in key.split("."):
            if not isinstance(value, dict):
                return None
            value = value.get(name)
        return value

    def robots(self) -> RobotsSection:
        return self.sections.robots

    @property
    def paced_hosts(self) -> list[str]:
        return parts.paced_hosts(self.sections)

    def exempt_rules(self) -> tuple[ExemptRule, ...]:
        return parts.exempt_rules(self.sections)

    def client_rules(self) -> tuple[ClientRule, ...]:
        return parts.client_rules(self.sections)

    def host_intervals(self) -> tuple[tuple[str, float], ...]:
        return parts.host_intervals(self.sections)

    def pipelines(self) -> tuple[PipelineRule, ...]:
        return parts.pipelines(self.sections)

    def pipeline_tokens(self) -> dict[str, str]:
        """Each configured pipeline's secret, read from its token_env variable or token_file (issue 27);
        a ConfigError names the key and never the secret."""
        out: dict[str, str] = {}
        for name, t in self.sections.pipelines.items():
            secret = _secret(f"pipelines.{name}", t.token_env, t.token_file)
            if secret:
                out[name] = secret
        return out

    def admin_token(self) -> str:
        """The token ``POST /release`` requires ([admin] token_env / token_file), "" when none is set."""
        a = self.sections.admin
        return _secret("admin", a.token_env, a.token_file)

    def pacing(self) -> PacingSettings:
        return parts.pacing(self.sections)

    @property
    def egress_name(self) -> str:
        """``[egress] name``, else this machine's host name (its valid characters only)."""
        return parts.egress_name(self.sections)

    def cache(self) -> CacheLimits:
        return parts.cache(self.sections)

    def backoff(self) -> BackoffPolicy:
        return BackoffPolicy.of(self.sections)

    def restart_changes(self, new: Config) -> list[str]:
        """The keys only a restart applies (the table's) whose value ``new`` changes, in table order."""
        return [key for key in RESTART_ONLY if new.get(key) != self.get(key)]

    def changes(self, new: Config) -> list[str]:
        """``key: old -> new`` for every key ``new`` changes (secrets shown as changed, never their value)."""
        return changes(self.raw, new.raw)


# Settings that only a restart applies (the table's); a reload that changes one says so.
RESTART_ONLY = restart_only()
# Keys that hold a path: made absolute at load time (see paths.py).
PATH_KEYS: tuple[tuple[str, ...], ...] = tuple(s.path for s in SETTINGS if s.kind == "path")


def build(
    raw: dict[str, Any], source: str = "<defaults>", overrides: Mapping[str, Any] | None = None
) -> Config:
    """Validate ``raw`` (the parsed TOML), apply overrides (env, then flags) and return the Config.

    Path keys come back absolute: relative to the config file's directory for values from the file,
    to the working directory for overrides."""
    merged = _section(raw, SCHEMA, "")
    base = Path(source).parent if source != "<defaults>" else Path.cwd()
    resolve_paths(merged, PATH_KEYS, base, os.environ)
    apply_overrides(merged, overrides or {})
    listen = parse_hostport(merged["listen"], "listen")
    data_dir = Path(merged["data_dir"]) if merged["data_dir"] else default_data_dir()
    return Config(raw=merged, source=source, listen=listen, data_dir=data_dir, sections=sections_from(merged))


def read_toml(path: str | os.PathLike[str], allow_empty: bool = True) -> dict[str, Any]:
    """The parsed file; every failure (missing, not UTF-8, not TOML, empty) is one ConfigError line."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a config file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 (byte {e.start})") from None
    if not allow_empty and not text.strip():
        # An editor that truncates before writing leaves this for a moment; defaults are never meant.
        raise ConfigError(f"{path}: the file is empty")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def load(
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, Any] | None = None,
    allow_empty: bool = True,
) -> Config:
    """The Config from ``path`` (defaults when None); ``allow_empty=False`` refuses an empty file (reload)."""
    if not path:
        return build({}, "<defaults>", overrides)
    raw = read_toml(path, allow_empty)
    try:
        return build(raw, str(path), overrides)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _secret(key: str, env: str, path: str) -> str:
    """A secret from the variable ``env`` or the first line of the file ``path`` (neither: ""); a
    ConfigError names the key and never the secret."""
    if env and path:
        raise ConfigError(f"{key}: token_env or token_file, not both")
    if env:
        secret = os.environ.get(env, "")
        if not secret:
            raise ConfigError(f"{key}.token_env: the variable {env} is not set (or empty)")
        return secret
    if not path:
        return ""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            secret = f.readline(4096).strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{key}.token_file: cannot read {path}: {type(e).__name__}") from None
    if not secret:
        raise ConfigError(f"{key}.token_file: {path} holds no secret on its first line")
    return secret
