"""Claim-case rows (see tests/support/claim_table.py): blocks (403), connection failures, the probe, the
adaptive interval, and the exempt ceiling (GCRA). Times are relative to the store's now.
"""

from __future__ import annotations

from politeproxy.policy.backoff import Kind
from politeproxy.policy.slots import Outcome
from tests.support.claim_table import ABSENT, B, Case, F

HOLD_ROWS = [
    # -- blocks (403): block_hold doubling to block_hold_cap, Retry-After wins where longer; the interval
    # is raised (adaptive) and steps back from the end of the hold
    Case(
        "block_first",
        {},
        ("throttle", None, 0.0, B),
        {"delay": 10.0, "blocks": 1, "throttles": 1, "backoff_until": 10.0, "adapt_interval": 1.0}
        | {"adapt_from": 10.0, "adapt_until": 70.0, "probe_until": ABSENT},
    ),
    Case("block_doubles", {"blocks": 1}, ("throttle", None, 0.0, B), {"delay": 20.0, "blocks": 2}),
    Case("block_capped", {"blocks": 5}, ("throttle", None, 0.0, B), {"delay": 40.0, "blocks": 6}),
    Case("block_retry_after_longer", {}, ("throttle", 30.0, 0.0, B), {"delay": 30.0, "backoff_until": 30.0}),
    Case("block_retry_after_shorter", {}, ("throttle", 5.0, 0.0, B), {"delay": 10.0}),
    Case("block_retry_after_huge", {}, ("throttle", 1e5, 0.0, B), {"delay": 300.0, "blocks": 1}),
    Case(
        "block_on_the_probe",
        {"blocks": 1, "probe_until": 20.0},
        ("throttle", None, 0.0, B),
        {"delay": 20.0, "blocks": 2, "probe_until": ABSENT},
    ),
    Case(
        "block_hold_beyond_backoff_cap_is_sane",
        {"blocks": 3, "backoff_until": 1500.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 1500.0, "backoff_until": 1500.0},
    ),
    # -- connection failures: a throttle; FAIL_BLOCK in a row a block; any other answer ends the row
    Case("failure_first", {}, ("throttle", None, 0.0, F), {"delay": 1.0, "fails": 1, "blocks": 0}),
    Case(
        "failure_third_is_block",
        {"fails": 2, "throttles": 2},
        ("throttle", None, 0.0, F),
        {"delay": 10.0, "fails": 0, "blocks": 1, "throttles": 3},
    ),
    Case("throttle_ends_failures", {"fails": 2}, ("throttle", None, 0.0), {"fails": 0, "blocks": 0}),
    # -- the probe: when the hold ends one request goes alone; the others look again until it answers
    Case(
        "probe_granted",
        {"blocks": 1},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "probe_until": 30.0, "next": 1.0, "probe": True},
    ),
    Case(
        "probe_out_waits",
        {"blocks": 1, "probe_until": 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 0.25, "next": ABSENT, "probe": False},
    ),
    Case(
        "probe_lease_expired",
        {"blocks": 1, "probe_until": -1.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "probe_until": 30.0},
    ),
    Case(
        "hold_before_probe",
        {"blocks": 1, "backoff_until": 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 5.0, "probe_until": ABSENT},
    ),
    Case(
        "probe_until_corrupt",
        {"blocks": 1, "probe_until": 1e6},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "probe_until": 30.0},
    ),
    Case(
        "blocks_corrupt", {"blocks": 5000}, ("claim", 1.0, 0.0, None), {"blocks": 1000, "probe_until": 30.0}
    ),
    Case(
        "success_ends_block_after_hold",
        {"blocks": 2, "probe_until": 20.0, "fails": 1},
        ("success",),
        {"blocks": 0, "probe_until": ABSENT, "fails": 0},
    ),
    Case(
        "success_during_hold_keeps_block",
        {"blocks": 1, "backoff_until": 50.0, "throttles": 1},
        ("success",),
        {"blocks": 1, "throttles": 0, "backoff_until": 50.0},
    ),
    # -- the adaptive interval: at least doubles on a throttle (floor 1 s), steps back in 4 equal steps
    Case(
        "adaptive_raised_first",
        {},
        ("throttle", 2.0, 0.0, Kind.THROTTLE, 0.5),
        {"adapt_interval": 1.0, "adapt_from": 2.0, "adapt_until": 62.0},
    ),
    Case(
        "adaptive_doubles_current",
        {"adapt_interval": 3.0, "adapt_from": -1.0, "adapt_until": 59.0},
        ("throttle", 2.0, 0.0, Kind.THROTTLE, 0.5),
        {"adapt_interval": 6.0, "adapt_from": 2.0, "adapt_until": 62.0},
    ),
    Case(
        "adaptive_doubles_from_a_step",
        {"adapt_interval": 4.5, "adapt_from": -31.0, "adapt_until": 29.0},
        ("throttle", None, 0.0, Kind.THROTTLE, 0.5),
        {"adapt_interval": 5.0, "delay": 1.0},
    ),
    Case(
        "adaptive_claim_raised",
        {"adapt_interval": 4.0, "adapt_from": 10.0, "adapt_until": 70.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": 4.0},
    ),
    Case(
        "adaptive_claim_second_step",
        {"adapt_interval": 4.5, "adapt_from": -31.0, "adapt_until": 29.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": 2.5},
    ),
    Case(
        "adaptive_claim_recovered",
        {"adapt_interval": 4.0, "adapt_from": -61.0, "adapt_until": -1.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": ABSENT},
    ),
    Case(
        "adaptive_interval_corrupt",
        {"adapt_interval": 1e9, "adapt_from": 0.0, "adapt_until": 60.0},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "adapt_interval": 0.0, "next_allowed": ABSENT},
    ),
    Case(
        "adaptive_from_the_future",
        {"adapt_interval": 2.0, "adapt_from": 1e7, "adapt_until": 1e7 + 60},
        ("claim", 0.5, 0.0, None),
        {"outcome": Outcome.GRANTED, "adapt_from": 0.0, "adapt_until": 0.0, "next_allowed": ABSENT},
    ),
    # -- the exempt ceiling (GCRA): a burst at once, then one per rate; held by backoff, block and probe
    Case(
        "exempt_fresh",
        {},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "tat": 0.02},
    ),
    Case(
        "exempt_within_burst",
        {"tat": 1.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "tat": 1.02},
    ),
    Case(
        "exempt_burst_spent",
        {"tat": 2.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.02, "tat": 2.02},
    ),
    Case(
        "exempt_too_late",
        {"tat": 5.0},
        ("exempt", 0.02, 100, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.02, "tat": 5.0},
    ),
    Case(
        "exempt_backoff",
        {"backoff_until": 3.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 3.0, "tat": ABSENT},
    ),
    Case(
        "exempt_backoff_too_late",
        {"backoff_until": 3.0},
        ("exempt", 0.02, 100, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.0},
    ),
    Case(
        "exempt_probe_out",
        {"blocks": 1, "probe_until": 5.0},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 0.25},
    ),
    Case(
        "exempt_is_the_probe",
        {"blocks": 1},
        ("exempt", 0.0, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "probe_until": 30.0, "probe": True},
    ),
    Case(
        "exempt_ceiling_off",
        {"tat": 50.0},
        ("exempt", 0.0, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0},
    ),
    Case(
        "exempt_tat_corrupt",
        {"tat": 1e6},
        ("exempt", 0.02, 100, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "tat": 0.02},
    ),
    Case(
        "exempt_not_holding_the_backoff",
        {"backoff_until": 3.0, "blocks": 1, "tat": 2.0},
        ("exempt", 0.02, 100, None, False),
        {"outcome": Outcome.GRANTED, "wait": 0.02, "tat": 2.02, "probe_until": ABSENT, "blocks": 1},
    ),
    Case(
        "exempt_burst_one",
        {"tat": 0.5},
        ("exempt", 1.0, 1, None),
        {"outcome": Outcome.GRANTED, "wait": 0.5, "tat": 1.5},
    ),
]
