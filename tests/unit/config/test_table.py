"""The table of settings (policy/table.py) is the one declaration of every key: everything derived from it
(schema, defaults, bounds, overrides, flags, restart-only list) agrees with it."""

from __future__ import annotations

from typing import Any

import pytest

from politeproxy.commands.cli import parser
from politeproxy.config.loading import SCHEMA, build
from politeproxy.config.overrides import OVERRIDES, env_overrides
from politeproxy.policy import settings as d
from politeproxy.policy.table import BY_KEY, SETTINGS, Setting, restart_only, setting
from politeproxy.policy.values import CONVERTERS, converter


def _schema_keys(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, spec in schema.items():
        if isinstance(spec, dict):
            out |= _schema_keys(spec, f"{prefix}{name}.")
        else:
            out.add(f"{prefix}{name}")
    return out


def test_every_key_is_declared_once() -> None:
    assert len(BY_KEY) == len(SETTINGS)
    plain = {s.key for s in SETTINGS if "*" not in s.key}
    tables = {s.key.split(".")[0] for s in SETTINGS if "*" in s.key}
    assert _schema_keys(SCHEMA) == plain | tables


def test_every_kind_has_a_converter() -> None:
    nested = {"exempt rules", "cache rules", "client rules"}
    assert {s.kind for s in SETTINGS} <= set(CONVERTERS) | nested


def _as_written(s: Setting) -> Any:
    """The default as a config file would write it: durations with a unit, lists as lists."""
    v = s.default
    if s.kind in ("duration", "rate"):
        return f"{v}s" if v else "0"
    return list(v) if isinstance(v, tuple) else v


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.default is not None], ids=lambda s: s.key)
def test_every_default_passes_its_own_check(s: Setting) -> None:
    got = converter(s)(_as_written(s), s.key)
    assert got == (list(s.default) if isinstance(s.default, tuple) else s.default)
    if s.bounds is not None and isinstance(s.default, int | float):
        assert s.bounds[0] <= s.default <= s.bounds[1]


def test_a_config_without_a_file_has_the_table_defaults() -> None:
    cfg = build({})
    for s in SETTINGS:
        if "*" not in s.key:
            want = list(s.default) if isinstance(s.default, tuple) else s.default
            assert cfg.get(s.key) == want, s.key
    assert d.DEFAULTS.schedule.global_rate == setting("schedule.global_rate").default == 0.2


def test_wildcard_keys_find_their_entry() -> None:
    assert setting("hosts.index.commoncrawl.org.interval") is BY_KEY["hosts.*.interval"]
    assert d.duration_bounds("hosts.a.b.interval") == (0.0, 3600.0)
    assert d.accepts_rate("hosts.a.b.interval") and d.accepts_rate("exempt.rate")


def test_overrides_and_flags_come_from_the_table() -> None:
    outside = [s for s in SETTINGS if s.env or s.flag]
    assert set(OVERRIDES) == {s.override for s in outside}
    assert set(env_overrides({})) == {s.override for s in SETTINGS if s.env}
    names = {"listen", "data_dir", "global_rate", "metrics_listen", "log_format", "redis_url", "auth_users"}
    names.add("upstream_ca")  # issue 24: a CA for the upstream without a config file
    names.add("egress_name")  # issue 24: replicas behind one NAT share one request window by this name
    names.add("workers")  # issue 28: worker processes on one port
    assert set(OVERRIDES) == names  # the names cli.py, App and the tests pass
    flags = {s.override: (s.flag, s.choices[-1] if s.choices else "v") for s in outside if s.flag}
    run = parser().parse_args(["run", *[x for pair in flags.values() for x in pair]])
    assert all(getattr(run, name) == value for name, (_flag, value) in flags.items())


def test_the_restart_only_list_is_the_tables() -> None:
    from politeproxy.config.loading import RESTART_ONLY

    assert RESTART_ONLY == restart_only()
    assert "schedule.global_rate" not in RESTART_ONLY and "schedule.backend" in RESTART_ONLY
    assert {"listen", "log_format", "intercept_s3_path_style", "auth.users"} <= set(RESTART_ONLY)
