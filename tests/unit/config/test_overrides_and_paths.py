"""Config values from outside the file and values that hold secrets or paths (issue 13 item 5):
redis_url schemes and masking, POLITEPROXY_AUTH_USERS, the environment overrides, and path resolution.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from politeproxy.config.loading import ConfigError, build, env_overrides, load
from politeproxy.config.overrides import parse_users
from politeproxy.config.paths import resolve_path
from politeproxy.policy.redis_url import check_redis_url, mask_url, redis_address

# -- redis_url --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://redis",
        "redis://:s3cret@redis:6379/0",
        "redis://user:s3cret@[::1]:6380/15",
        "rediss://cache.example.org:6380/0",
        "unix:///run/redis/redis.sock?db=0",
        "unix://:pw@/run/redis.sock",
    ],
)
def test_redis_urls_redis_py_reads_are_accepted(url: str) -> None:
    """The three schemes redis-py's from_url reads: redis, rediss (TLS) and unix."""
    import redis.asyncio as aioredis

    assert check_redis_url(url, "schedule.redis_url") == url
    aioredis.from_url(url)  # and redis-py agrees (no connection is made)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://redis:6379/0", "got scheme 'http'"),
        ("localhost:6379", "got scheme 'localhost'"),
        ("redis-sentinel://h:26379", "got scheme 'redis-sentinel'"),
        ("//redis:6379", "got no scheme"),
        ("redis://:s3cret@redis:99999/0", "not a URL with a valid port"),
        ("redis://:s3cret@:6379/0", "no host"),
        ("redis://redis:6379/zero", "database number"),
        ("unix://relative.sock", "absolute socket path"),
        ("redis://red is:6379", "without spaces"),
    ],
)
def test_other_redis_urls_are_config_errors_naming_the_key(url: str, why: str) -> None:
    """A wrong scheme (the issue: it passed check-config, then run ended in a traceback), a bad port, no
    host: one ConfigError naming schedule.redis_url, and the password never appears in it."""
    with pytest.raises(ConfigError) as e:
        build({"schedule": {"redis_url": url}})
    assert str(e.value).startswith("schedule.redis_url: ") and why in str(e.value)
    assert "s3cret" not in str(e.value)


def test_the_env_override_is_checked_and_named() -> None:
    """POLITEPROXY_REDIS_URL is checked like the file's key, and the error says where it came from."""
    with pytest.raises(ConfigError) as e:
        build({}, overrides=env_overrides({"POLITEPROXY_REDIS_URL": "http://:s3cret@redis/0"}))
    assert "schedule.redis_url" in str(e.value) and "POLITEPROXY_REDIS_URL" in str(e.value)
    assert "s3cret" not in str(e.value)


@settings(max_examples=250, deadline=None)
@given(
    # No lone surrogates: a URL is text that encodes (TOML and the environment never hold them).
    user=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="QZ"), max_size=12
    ),
    password=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
    host=st.sampled_from(["redis", "127.0.0.1", "[::1]", "a.b.example"]),
    port=st.one_of(st.none(), st.integers(0, 70000)),
)
@example(user="", password="s3cret", host="redis", port=6379)
def test_a_masked_url_never_shows_the_password(user: str, password: str, host: str, port: int | None) -> None:
    """mask_url and redis_address never raise and never show the password (it starts with "QZ", which
    nothing else in the URL holds); check_redis_url's errors never show it either."""
    from urllib.parse import quote

    pw = quote("QZ" + password, safe="")
    url = f"redis://{quote(user, safe='')}:{pw}@{host}{'' if port is None else f':{port}'}/0"
    for shown in (mask_url(url), redis_address(url)):
        assert isinstance(shown, str) and "QZ" not in shown
    try:
        check_redis_url(url, "k")
    except ConfigError as e:
        assert "QZ" not in str(e)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.text(max_size=80), st.integers(), st.none(), st.binary(max_size=10)))
def test_check_redis_url_never_raises_anything_else(value: Any) -> None:
    """Any value: the URL back, or a one-line ConfigError starting with the key."""
    try:
        assert check_redis_url(value, "schedule.redis_url") == value
    except ConfigError as e:
        assert str(e).startswith("schedule.redis_url: ") and "\n" not in str(e)


def test_redis_address_names_the_default_port() -> None:
    assert redis_address("redis://:pw@redis/0") == "redis://:***@redis:6379/0"
    assert redis_address("redis://u:pw@[::1]:7000/1") == "redis://u:***@[::1]:7000/1"
    assert redis_address("unix://:pw@/run/r.sock") == "unix://:***@/run/r.sock"


# -- secrets from the environment -------------------------------------------------------------------


def test_auth_users_from_the_environment() -> None:
    """POLITEPROXY_AUTH_USERS replaces [auth] users; a malformed entry is an error that shows no password."""
    cfg = build(
        {"auth": {"users": {"old": "pw0"}}},
        overrides=env_overrides({"POLITEPROXY_AUTH_USERS": "alice:pw1, bob:p:w2\ncarol:x"}),
    )
    assert cfg["auth"]["users"] == {"alice": "pw1", "bob": "p:w2", "carol": "x"}
    for bad in ("alice", "alice:", ":pw", " , "):
        with pytest.raises(ConfigError) as e:
            build({}, overrides={"auth_users": bad})
        assert "auth.users" in str(e.value) and "POLITEPROXY_AUTH_USERS" in str(e.value)
        assert "pw" not in str(e.value)
    assert parse_users({"a": "b"}, "k") == {"a": "b"}


def test_global_rate_override_names_the_flag_and_the_variable() -> None:
    with pytest.raises(ConfigError) as e:
        build({}, overrides=env_overrides({"POLITEPROXY_GLOBAL_RATE": "5"}))
    assert str(e.value) == (
        "schedule.global_rate: bare number 5: write 5/s for a rate or 5s for a gap"
        " (from --global-rate or POLITEPROXY_GLOBAL_RATE)"
    )
    assert build({}, overrides={"global_rate": "300/m"})["schedule"]["global_rate"] == pytest.approx(0.2)


# -- paths ------------------------------------------------------------------------------------------


def test_paths_in_the_file_resolve_against_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~, $VAR, ${VAR} and relative paths are resolved when the config loads: a relative path in the
    file is relative to the file's directory, whatever the working directory."""
    monkeypatch.setenv("PP_TEST_BASE", str(tmp_path / "base"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg_file = tmp_path / "etc" / "pp.toml"
    cfg_file.parent.mkdir()
    cfg_file.write_text('data_dir = "state/../data"\n[upstream]\nca_file = "${PP_TEST_BASE}/ca.pem"\n')
    monkeypatch.chdir(tmp_path)
    cfg = load(cfg_file)
    assert cfg.data_dir == tmp_path / "etc" / "data"
    assert cfg["data_dir"] == str(tmp_path / "etc" / "data")
    assert cfg["upstream"]["ca_file"] == str(tmp_path / "base" / "ca.pem")
    cfg_file.write_text('data_dir = "~/pp"\n')
    assert load(cfg_file).data_dir == tmp_path / "home" / "pp"
    cfg_file.write_text('data_dir = "$PP_TEST_BASE/pp"\n')
    assert load(cfg_file).data_dir == tmp_path / "base" / "pp"


def test_paths_from_flags_and_env_resolve_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert build({}, overrides={"data_dir": "rel"}).data_dir == tmp_path / "rel"
    assert (
        build({}, overrides=env_overrides({"POLITEPROXY_DATA_DIR": "~/d"})).data_dir == tmp_path / "h" / "d"
    )


def test_an_unset_variable_is_an_error_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PP_TEST_UNSET", raising=False)
    with pytest.raises(ConfigError, match=r"^data_dir: \$PP_TEST_UNSET is not set"):
        build({"data_dir": "$PP_TEST_UNSET/x"})
    with pytest.raises(ConfigError, match=r"^upstream.ca_file: cannot expand '~no-such-user-pp'"):
        build({"upstream": {"ca_file": "~no-such-user-pp/ca.pem"}})


@settings(max_examples=400, deadline=None)
@given(value=st.text(max_size=60))
@example(value="a\0b")
@example(value="$")
@example(value="${")
def test_resolve_path_is_absolute_or_a_config_error(value: str) -> None:
    """Any text: "" stays "", anything else becomes an absolute normalised path, or a ConfigError
    naming the key; never another exception."""
    env = {"HOME": "/home/u", "X": "/x"}
    try:
        got = resolve_path(value, "data_dir", Path("/base"), env)
    except ConfigError as e:
        assert str(e).startswith("data_dir: ")
        return
    assert got == "" if not value else os.path.isabs(got) and os.path.normpath(got) == got


def test_long_name_lists_are_summed_up_on_one_line() -> None:
    """`politeproxy ca` and its missing-names warning: the S3 endpoint forms run to 183 names, so the
    line shows four and a count (``ca --all`` lists them)."""
    from politeproxy.commands.cli import _names

    names = [f"h{i}.example" for i in range(183)]
    assert _names(names[:4]) == "h0.example, h1.example, h2.example, h3.example"
    line = _names(names)
    assert line.startswith("h0.example, h1.example, h2.example, h3.example and 179 more (183 names;")
    assert "h4.example" not in line


@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet=st.sampled_from("ab:, \n\tQZ\x00é"), max_size=40))
def test_auth_users_from_any_text_is_a_table_or_an_error_without_passwords(value: str) -> None:
    """POLITEPROXY_AUTH_USERS: any text gives non-empty names and passwords, or a ConfigError naming the
    key that shows no part of the value (passwords are in it)."""
    try:
        users = parse_users(value, "auth.users")
    except ConfigError as e:
        assert str(e).startswith("auth.users: ") and "Q" not in str(e) and "Z" not in str(e)
        return
    assert users and all(name and password for name, password in users.items())
    assert all(
        ":" not in name and not any(c.isspace() or c == "," for c in name + pw) for name, pw in users.items()
    )
