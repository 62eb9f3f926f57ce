"""Claim-case rows (see tests/support/claim_table.py): the slot arithmetic of claims, records no legitimate
wait gives, odd numbers handed to the store, throttles, and success. Times are relative to the store's now.
"""

from __future__ import annotations

import math

from politeproxy.policy.slots import Outcome
from tests.support.claim_table import DAY, FF, NOW, Case

SLOT_ROWS = [
    # -- claims: the slot arithmetic
    Case(
        "fresh",
        {},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next": 1.0, "probe": False},
    ),
    Case(
        "queued",
        {"next": 0.5},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.5, "next": 1.5},
    ),
    Case(
        "host_interval",
        {"next_allowed": 2.0, "next": 0.2},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 2.0, "next": 0.2},
    ),
    Case(
        "too_late_slot",
        {"next": 5.0},
        ("claim", 1.0, 0.0, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 5.0, "next": 5.0},
    ),
    Case(
        "too_late_backoff",
        {"backoff_until": 3.0},
        ("claim", 1.0, 0.0, 1.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.0},
    ),
    Case(
        "legit_backoff_waits",
        {"backoff_until": 1000.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 1000.0, "backoff_until": 1000.0},
    ),
    Case(
        "interval_step",
        {},
        ("claim", 0.5, 2.0, None),
        {"outcome": Outcome.GRANTED, "next": 0.5, "next_allowed": 2.0},
    ),
    Case(
        "crawl_delay_step",
        {"crawl_delay": 3.0},
        ("claim", 0.5, 1.0, None),
        {"outcome": Outcome.GRANTED, "next_allowed": 3.0},
    ),
    Case(
        "gap_off",
        {"next": 0.3},
        ("claim", 0.0, 1.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next": 0.3, "next_allowed": 1.0},
    ),
    Case(
        "within_bound", {"next": 63.0}, ("claim", 1.0, 0.0, None), {"outcome": Outcome.GRANTED, "wait": 63.0}
    ),
    Case(
        "not_before",
        {"next": 0.2},
        ("claim", 1.0, 0.0, None, 0.5),
        {"outcome": Outcome.GRANTED, "wait": 0.5, "next": 1.5},
    ),
    Case(
        "not_before_too_late",
        {},
        ("claim", 1.0, 0.0, 1.0, 3.0),
        {"outcome": Outcome.TOO_LATE, "wait": 3.0},
    ),
    # -- records no legitimate wait gives (a clock step back, 0xFF bytes, a stray HSET): the global next is
    # treated as now + one gap (a record corrupted under a running proxy must not land a grant on the one it
    # just made), a host time as now
    Case(
        "global_2h_ahead",
        {"next": 7200.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 1.0, "next": 2.0},
    ),
    Case(
        "global_70s_ahead",
        {"next": 70.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 1.0, "next": 2.0},
    ),
    Case(
        "global_ahead_not_granted",
        {"next": 7200.0, "backoff_until": 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.HOST_NOT_READY, "wait": 5.0, "next": 1.0},
    ),
    Case(
        "global_ff",
        {"next": FF},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 1.0, "next": 2.0},
    ),
    Case(
        "global_before_epoch",
        {"next": -NOW - 5.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0},
    ),
    Case(
        "host_next_ff",
        {"next_allowed": FF},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next_allowed": 0.0},
    ),
    Case(
        "host_next_2h",
        {"next_allowed": 7200.0},
        ("claim", 1.0, 2.0, None),
        {"outcome": Outcome.GRANTED, "wait": 0.0, "next_allowed": 2.0},
    ),
    Case(
        "backoff_beyond_max",
        {"backoff_until": DAY + 100.0},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "backoff_until": 0.0},
    ),
    Case(
        "crawl_delay_corrupt",
        {"crawl_delay": 1e9},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "crawl_delay": 0.0},
    ),
    Case(
        "robots_far_ahead",
        {"robots_expires": 1e9},
        ("claim", 1.0, 0.0, None),
        {"outcome": Outcome.GRANTED, "robots_expires": 0.0},
    ),
    # -- odd numbers handed to the store never raise (OverflowError) and never switch pacing off
    Case(
        "gap_inf", {}, ("claim", math.inf, 0.0, None), {"outcome": Outcome.GRANTED, "wait": 0.0, "next": DAY}
    ),
    Case("gap_nan", {}, ("claim", math.nan, 0.0, None), {"outcome": Outcome.GRANTED, "next": DAY}),
    Case(
        "interval_inf", {}, ("claim", 1.0, math.inf, None), {"outcome": Outcome.GRANTED, "next_allowed": DAY}
    ),
    # -- throttles: backoff.throttle_delay and apply_throttle in one step
    Case("throttle_first", {}, ("throttle", None, 0.5), {"delay": 1.1, "throttles": 1, "backoff_until": 1.1}),
    Case("throttle_fourth", {"throttles": 3}, ("throttle", None, 0.5), {"delay": 8.8, "throttles": 4}),
    Case(
        "throttle_retry_after",
        {"throttles": 2},
        ("throttle", 5.0, 0.9),
        {"delay": 5.0, "throttles": 3, "backoff_until": 5.0},
    ),
    Case("throttle_capped", {}, ("throttle", 1000.0, 0.0), {"delay": 300.0, "backoff_until": 300.0}),
    Case(
        "throttle_keeps_longer",
        {"backoff_until": 50.0},
        ("throttle", 5.0, 0.0),
        {"delay": 5.0, "backoff_until": 50.0},
    ),
    Case(
        "throttle_absurd_backoff",
        {"backoff_until": 1e5},
        ("throttle", None, 0.0),
        {"delay": 1.0, "backoff_until": 1.0},
    ),
    Case("throttle_many", {"throttles": 70}, ("throttle", None, 0.0), {"delay": 300.0, "throttles": 71}),
    Case(
        "throttle_count_corrupt",
        {"throttles": 5000},
        ("throttle", None, 0.0),
        {"delay": 300.0, "throttles": 1001},
    ),
    Case(
        "throttle_retry_after_zero",
        {},
        ("throttle", 0.0, 0.0),
        {"delay": 0.0, "backoff_until": 0.0, "throttles": 1},
    ),
    Case("throttle_retry_after_inf", {}, ("throttle", math.inf, 0.0), {"delay": 300.0}),
    Case("throttle_keeps_interval", {"next_allowed": 30.0}, ("throttle", 1.0, 0.0), {"next_allowed": 30.0}),
    # -- success resets the count, not the backoff already promised
    Case(
        "success",
        {"throttles": 3, "backoff_until": 10.0},
        ("success",),
        {"throttles": 0, "backoff_until": 10.0},
    ),
    Case("success_unknown", {}, ("success",), {"throttles": 0}),
]
