"""[clients] (issue 41): rules on the User-Agent before the built-in ones, keep_defaults, and the checks."""

from __future__ import annotations

import pytest

from politeproxy.config.loading import build
from politeproxy.policy.clients import DEFAULT_CLIENT_RULES
from politeproxy.policy.settings import ConfigError

BOTO3 = "Boto3/1.44.8 md/Botocore#1.44.18"


def test_no_clients_table_means_the_built_in_rules() -> None:
    s = build({}).pacing()
    assert s.client_rules == DEFAULT_CLIENT_RULES and s.bound_for(BOTO3) == 55.0


def test_listed_rules_come_first() -> None:
    s = build({"clients": {"rules": [{"user_agent": "Boto3/", "max_wait": "40s"}]}}).pacing()
    assert s.client_rules[1:] == DEFAULT_CLIENT_RULES and s.bound_for(BOTO3) == 40.0


def test_keep_defaults_false_leaves_only_the_listed_rules() -> None:
    s = build({"clients": {"keep_defaults": False}, "pacing": {"max_wait": "5s"}}).pacing()
    assert s.client_rules == () and s.bound_for(BOTO3) == 5.0


@pytest.mark.parametrize(
    "rules",
    [
        "Boto3/",
        [{"user_agent": "", "max_wait": "10s"}],
        [{"user_agent": "x\n", "max_wait": "10s"}],
        [{"user_agent": "x", "max_wait": "2h"}],
        [{"user_agent": "x", "max_wait": "10s", "typo": 1}],
        [{"user_agent": f"x{i}", "max_wait": "1s"} for i in range(65)],
    ],
)
def test_a_bad_rule_is_named(rules: object) -> None:
    with pytest.raises(ConfigError, match=r"clients\.rules"):
        build({"clients": {"rules": rules}})
