"""Names with an owner (issue 27 item 3): a configured pipeline may require a secret, sent as the proxy
password of its user name. A request that names it with another password (or none) counts as the guest
pipeline NAME~guest and is reported; ``[auth] users`` come first, as before. The secret comes from an
environment variable or a file, never from the config, and a ConfigError never shows it."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from politeproxy.config.loading import ConfigError, build
from politeproxy.policy.access import GUEST, Access


def basic(user: str, password: str = "") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_token_makes_the_name_binding() -> None:
    guests: list[tuple[str, str]] = []
    a = Access([], {}, {"urls": "s3cret"}, on_guest=lambda n, c: guests.append((n, c)))
    assert a.pipeline(basic("urls", "s3cret"), "10.0.0.1") == "urls"
    assert a.pipeline(basic("urls", "x"), "10.0.0.2") == "urls" + GUEST
    assert a.pipeline(basic("urls"), "10.0.0.3") == "urls" + GUEST
    assert a.pipeline(basic("other", "x"), "10.0.0.4") == "other"  # no token: any password, as before
    assert guests == [("urls", "10.0.0.2"), ("urls", "10.0.0.3")]


def test_auth_users_come_first() -> None:
    a = Access([], {"urls": "login"}, {"urls": "s3cret"})
    assert a.pipeline(basic("urls", "login"), "10.0.0.1") == "urls"  # auth_ok checked the password


def test_the_guest_name_stays_a_name() -> None:
    long = "p" * 64
    a = Access([], {}, {long: "s"})
    name = a.pipeline(basic(long, "x"), "c")
    assert name.endswith(GUEST) and len(name) <= 64


def test_tokens_come_from_a_variable_or_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("from-file\nignored\n")
    monkeypatch.setenv("PP_TOKEN_URLS", "from-env")
    cfg = build(
        {
            "pipelines": {
                "urls": {"token_env": "PP_TOKEN_URLS"},
                "bulk": {"token_file": str(secret_file)},
                "open": {"weight": 2},
            }
        }
    )
    assert cfg.pipeline_tokens() == {"urls": "from-env", "bulk": "from-file"}


def test_a_missing_secret_is_named_not_shown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PP_NOT_SET", raising=False)
    with pytest.raises(ConfigError, match="PP_NOT_SET is not set"):
        build({"pipelines": {"urls": {"token_env": "PP_NOT_SET"}}}).pipeline_tokens()
    with pytest.raises(ConfigError, match="cannot read"):
        build({"pipelines": {"urls": {"token_file": str(tmp_path / "absent")}}}).pipeline_tokens()
    monkeypatch.setenv("PP_SET", "hunter2")
    with pytest.raises(ConfigError, match="not both") as e:
        cfg = {"token_env": "PP_SET", "token_file": str(tmp_path / "x")}
        build({"pipelines": {"urls": cfg}}).pipeline_tokens()
    assert "hunter2" not in str(e.value)
