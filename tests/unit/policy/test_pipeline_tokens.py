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


LOOK_ALIKES = [
    "url fetch",
    'url"fetch',
    "urléfetch",
    "url\x01fetch",
    "url'fetch",
    "url\\fetch",
    "url\x7ffetch",
]


@pytest.mark.parametrize("name", LOOK_ALIKES + ["p" * 64 + "x"], ids=repr)
def test_tokens_were_checked_on_the_raw_name_then_the_name_was_cleaned(name: str) -> None:
    """Issue 42, item 3: a name whose cleaned form is a token pipeline's, but not the name sent, counted as
    the protected pipeline without its secret. It is refused now (407 naming the rule), whatever password."""
    protected = "p" * 64 if name.startswith("p") else "url_fetch"
    a = Access([], {}, {protected: "s3cret"})
    for password in ("", "guess", "s3cret"):
        why = a.look_alike(basic(name, password))
        assert why is not None and protected in why and "token" in why
        assert "s3cret" not in why and name not in why  # neither the secret nor the raw name echoed


def test_names_counted_as_they_came_or_without_a_token_are_no_look_alikes() -> None:
    a = Access([], {}, {"url_fetch": "s3cret"})
    assert a.look_alike(basic("url_fetch", "wrong")) is None  # the exact name: a guest, as before
    assert a.look_alike(basic("url_fetch", "s3cret")) is None
    assert a.look_alike(basic("other fetch", "x")) is None  # cleaned to other_fetch: no token, counted so
    assert (
        a.look_alike(None) is None and a.look_alike("Basic !!!") is None and a.look_alike(basic("")) is None
    )
    assert Access([], {"url fetch": "pw"}, {"url_fetch": "s"}).look_alike(basic("url fetch", "pw")) is None
    assert Access([], {}, {}).look_alike(basic("url fetch")) is None
