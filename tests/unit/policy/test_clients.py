"""policy/clients.py: hold bounds per client (User-Agent prefixes) and an AWS SDK's attempt number."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.clients import DEFAULT_CLIENT_RULES, ClientRule, bound_for, sdk_attempt

BOTO3 = "Boto3/1.44.8 md/Botocore#1.44.18 ua/2.1 os/linux#6.1 md/arch#x86_64 lang/python#3.11.7"
CLI = "aws-cli/1.46.3 md/Botocore#1.44.18 ua/2.1 os/linux#6.1 md/arch#x86_64 lang/python#3.11.7"


def test_the_built_in_rules_hold_each_client_under_its_own_timeout() -> None:
    rules = DEFAULT_CLIENT_RULES
    assert bound_for(rules, BOTO3, 25.0) == 55.0 and bound_for(rules, CLI, 25.0) == 55.0
    assert bound_for(rules, "duckdb/v1.4.4(linux_amd64) python/3.11.7", 40.0) == 25.0
    assert bound_for(rules, "pypi_cdx_toolkit/0.9.38", 40.0) == 25.0
    assert bound_for(rules, "python-requests/2.32", 25.0) == 25.0  # no rule: pacing.max_wait
    assert bound_for(rules, None, 7.0) == 7.0 and bound_for(rules, "", 7.0) == 7.0
    assert all(r.why for r in rules)  # the docs name each client's timeout


def test_the_first_matching_rule_wins_so_a_configured_one_overrides_a_default() -> None:
    rules = (ClientRule("Boto3/", 20.0),) + DEFAULT_CLIENT_RULES
    assert bound_for(rules, BOTO3, 25.0) == 20.0
    assert bound_for((), BOTO3, 25.0) == 25.0  # keep_defaults = false and no rules


@given(st.text(max_size=600))
def test_any_user_agent_gets_a_bound(ua: str) -> None:
    assert bound_for(DEFAULT_CLIENT_RULES, ua, 25.0) in {25.0, 55.0, 45.0}


def test_sdk_attempt_reads_amz_sdk_request() -> None:
    assert sdk_attempt("attempt=1; max=3") == 1
    assert sdk_attempt("ttl=20261207T083000Z; attempt=2; max=100") == 2
    assert sdk_attempt("Attempt = 3") == 3
    for bad in (None, "", "attempt=", "attempt=-1", "attempt=x", "max=3", "attempt=99999", "a" * 1000):
        assert sdk_attempt(bad) == 0


@given(st.text(max_size=300))
def test_sdk_attempt_never_raises(value: str) -> None:
    assert 0 <= sdk_attempt(value) <= 9999
