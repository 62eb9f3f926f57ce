"""policy/window.py: the request window Common Crawl enforces (issue 24 item 1), as pure arithmetic.

The cases: a full window waits until its oldest bucket leaves; a width changed by a reload keeps every
count at least as long as it should last; a corrupt state is bounded (at most about one window more) and
never raises; a slot too far ahead waits until it can be counted; ``divided`` for the failover store.
The property: whatever the sequence of grants (time steps, paced slots reserved ahead, exempt slots now),
no trailing window of ``seconds`` holds more than ``limit`` granted slot times.
"""

from __future__ import annotations

import bisect
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.policy.slots import Claim, Outcome
from politeproxy.policy.window import (
    AHEAD,
    BUCKETS,
    EPSILON,
    LATE,
    MAX_COUNT,
    WindowRule,
    WindowState,
    divided,
    gate,
    live,
    record,
    used,
    wait,
)

T0 = 1_699_999_992.0  # a multiple of 12 s: bucket edges of the widths below (0.2 s, 1.2 s) fall on it
RULE = WindowRule("data.commoncrawl.org", "egress-a", 10.0, 3)  # buckets of 0.2 s


def granted(at: float, now: float) -> Claim:
    return Claim(Outcome.GRANTED, at - now, at)


def grant_all(rule: WindowRule, times: list[float]) -> WindowState:
    """A window with a request granted (and counted) at each of ``times``, each asked at its own time."""
    state = WindowState()
    for t in times:
        state, _ = live(state, t, rule)
        c, new = gate(granted(t, t), t, state, rule)
        assert c.granted and new is not None, (t, state)
        state = new
    return state


def most_in_a_window(times: list[float], seconds: float) -> int:
    """The most of ``times`` any closed window [t - seconds, t] holds (the busiest ends on one of them)."""
    ts = sorted(times)
    return max((sum(1 for s in ts if t - seconds <= s <= t) for t in ts), default=0)


# -- a full window -------------------------------------------------------------------------------------


def test_a_full_window_waits_until_its_oldest_bucket_leaves() -> None:
    state = grant_all(RULE, [T0 + 0.05, T0 + 1.05, T0 + 2.05])
    now = T0 + 3.0
    st8, ok = live(state, now, RULE)
    assert ok and used(st8, now, RULE) == 3
    c, new = gate(granted(now, now), now, st8, RULE)
    assert new is None and not c.granted and c.window
    assert c.outcome is Outcome.HOST_NOT_READY
    # The oldest request's bucket is [T0, T0 + 0.2): it stops counting for a request at t once t - 11
    # (the window plus LATE, RULE.reach) is past the bucket's end: the next request goes at T0 + 11.2.
    assert RULE.reach == 10.0 + LATE == 11.0
    assert math.isclose(c.at, T0 + 11.2 + EPSILON, abs_tol=1e-6), c.at - T0
    assert math.isclose(c.wait, c.at - now, abs_tol=1e-9)
    # Just before that, still full; at it, granted and counted at its own slot.
    before = c.at - 0.01
    assert wait(live(st8, before, RULE)[0], before, before, RULE) > 0
    later, _ = live(st8, c.at, RULE)
    ok_claim, counted = gate(granted(c.at, c.at), c.at, later, RULE)
    assert ok_claim.granted and counted is not None
    assert used(counted, c.at, RULE) == 2  # status shows the 10 s window: the first bucket has left it


def test_a_full_window_past_the_deadline_is_too_late() -> None:
    state = grant_all(RULE, [T0, T0 + 0.5, T0 + 1.0])
    now = T0 + 2.0
    c, new = gate(granted(now, now), now, live(state, now, RULE)[0], RULE, deadline=now + 5.0)
    assert c.outcome is Outcome.TOO_LATE and c.window and new is None
    assert c.wait > 5.0


def test_the_bucket_of_the_window_start_counts_whole() -> None:
    """Conservative: a request at the window's far edge counts, so a closed window holds the limit too."""
    rule = WindowRule("s", "e", 10.0, 1)
    state = grant_all(rule, [T0])
    c, _ = gate(granted(T0 + 10.0, T0 + 10.0), T0 + 10.0, live(state, T0 + 10.0, rule)[0], rule)
    assert not c.granted and c.window


def test_reserved_future_slots_count_for_earlier_requests() -> None:
    """A paced slot reserved 5 s ahead fills the window of a request asked for now."""
    rule = WindowRule("s", "e", 10.0, 1)
    state, _ = live(WindowState(), T0, rule)
    c, state2 = gate(granted(T0 + 5.0, T0), T0, state, rule)
    assert c.granted and state2 is not None
    assert used(state2, T0, rule) == 1
    now_claim, _ = gate(granted(T0, T0), T0, state2, rule)
    assert not now_claim.granted and now_claim.window


def test_off_and_refused_claims_pass_through() -> None:
    off = WindowRule("s", "e", 10.0, 0)
    full = grant_all(RULE, [T0, T0, T0])
    c = granted(T0, T0)
    assert gate(c, T0, full, None) == (c, None)
    assert gate(c, T0, full, off) == (c, None)
    assert wait(full, T0, T0, off) == 0.0
    refused = Claim(Outcome.HOST_NOT_READY, 1.0, T0 + 1.0)
    assert gate(refused, T0, WindowState(), RULE) == (refused, None)


def test_record_and_used() -> None:
    state = record(record(record(WindowState(), T0 + 0.1, RULE), T0 + 0.15, RULE), T0 + 20.0, RULE)
    assert state.buckets == ((round(T0 / 0.2), 2), (round((T0 + 20.0) / 0.2), 1))
    assert used(state, T0 + 1.0, RULE) == 3  # the slot reserved 19 s ahead counts already
    assert used(state, T0 + 10.5, RULE) == 1  # the first bucket has left
    assert state.total() == 3


# -- far-future slots ----------------------------------------------------------------------------------


def test_a_slot_too_far_ahead_waits_until_it_can_be_counted() -> None:
    w = RULE.width
    far = T0 + (AHEAD + 5) * w + 0.01  # beyond the AHEAD buckets a record keeps
    state, _ = live(WindowState(), T0, RULE)
    c, new = gate(granted(far, T0), T0, state, RULE)
    assert new is None and c.window and c.outcome is Outcome.HOST_NOT_READY
    assert c.at == far  # the request's own slot stays the earliest it could go
    asked = T0 + wait(state, far, T0, RULE)
    assert asked < far
    c2, counted = gate(granted(far, asked), asked, live(state, asked, RULE)[0], RULE)
    assert c2.granted and counted is not None  # asked again when told, it is counted
    assert live(counted, asked, RULE)[1]


# -- the window changed by a reload ---------------------------------------------------------------------


def _moved(state: WindowState, now: float, rule: WindowRule) -> WindowState:
    st8, ok = live(state, now, rule)
    assert ok, "a changed width is a reload, not a corrupt record"
    assert st8.width == rule.width and st8.total() == state.total()
    return st8


def test_a_wider_window_keeps_every_count_until_its_own_end() -> None:
    old = WindowRule("s", "e", 10.0, 5)
    state = grant_all(old, [T0 + 1.0, T0 + 2.0, T0 + 3.0])
    new = WindowRule("s", "e", 60.0, 3)  # buckets of 1.2 s
    st8 = _moved(state, T0 + 4.0, new)
    # Every count moved to the end of the newest old bucket (T0 + 3.2): none leaves before it should.
    c, _ = gate(granted(T0 + 62.0, T0 + 62.0), T0 + 62.0, live(st8, T0 + 62.0, new)[0], new)
    assert not c.granted and c.window  # the request at T0 + 1 would have left; the moved counts did not
    assert c.at >= T0 + 3.0 + 60.0


def test_a_narrower_window_keeps_every_count_until_its_own_end() -> None:
    old = WindowRule("s", "e", 60.0, 10)  # buckets of 1.2 s
    state = grant_all(old, [T0 + 1.0, T0 + 2.0, T0 + 3.0])
    new = WindowRule("s", "e", 10.0, 3)
    st8 = _moved(state, T0 + 4.0, new)
    for t in (T0 + 4.0, T0 + 12.0, T0 + 3.6 + new.reach - 0.01):  # the last old bucket ends at T0 + 3.6
        c, _ = gate(granted(t, t), t, live(st8, t, new)[0], new)
        assert not c.granted and c.window, t - T0
    t = T0 + 3.6 + new.reach + 0.21
    assert gate(granted(t, t), t, live(st8, t, new)[0], new)[0].granted


def test_a_narrower_window_keeps_reserved_slots_ahead() -> None:
    """Slots reserved 15 s ahead under a 300 s window, then a reload to 10 s: their counts still stand
    where those slots are (the new window keeps 20 s of buckets ahead of now). Slots reserved further
    ahead than that are kept at the new window's furthest bucket (policy.window.live says why)."""
    old = WindowRule("s", "e", 300.0, 100)
    state, _ = live(WindowState(), T0, old)
    for _ in range(3):
        c, new_state = gate(granted(T0 + 15.0, T0), T0, state, old)
        assert c.granted and new_state is not None
        state = new_state
    new = WindowRule("s", "e", 10.0, 3)
    st8, ok = live(state, T0 + 1.0, new)
    assert ok and st8.total() == 3
    for now in (T0 + 1.0, T0 + 14.0, T0 + 24.0):
        st8, _ = live(st8, now, new)
        at = max(now, T0 + 15.0)
        c, _ = gate(granted(at, now), now, st8, new)
        assert not c.granted and c.window, f"a grant at T0+{at - T0:g} from now = T0+{now - T0:g}: {st8}"
        assert st8.total() == 3


def test_a_width_a_nanosecond_off_is_the_same_width() -> None:
    """The file record keeps the width in whole nanoseconds: 1.1 s / 50 comes back a hair off. That is the
    same window, not a reload (a reload folds every count into one bucket: the window would never drain)."""
    rule = WindowRule("s", "e", 1.1, 5)
    state = grant_all(rule, [T0 + 0.1, T0 + 0.3, T0 + 0.5])
    off = WindowState(round(rule.width * 1e9) / 1e9, state.buckets)
    assert off.width != rule.width
    st8, ok = live(off, T0 + 0.6, rule)
    assert ok and st8 == state


# -- corrupt states -------------------------------------------------------------------------------------

widths = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(0.2),
    st.sampled_from([0.0, -0.2, 1e-300, 1e300]),
)
indexes = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=round(T0 / 0.2) - 200, max_value=round(T0 / 0.2) + 400),
)
counts = st.one_of(st.integers(min_value=-(2**40), max_value=2**40), st.integers(min_value=1, max_value=5))
states = st.builds(
    WindowState, widths, st.lists(st.tuples(indexes, counts), max_size=20).map(lambda b: tuple(b))
)


@settings(max_examples=400, deadline=None)
@given(states, st.floats(min_value=0.0, max_value=30.0))
def test_a_corrupt_state_is_bounded_and_never_raises(state: WindowState, dt: float) -> None:
    """Any width (NaN, inf, 0, negative) and any buckets (unsorted, repeated, far ahead, negative counts):
    live() gives a state within its bounds, and no request waits longer than about one window past the
    furthest slot a legitimate record can hold (AHEAD buckets ahead of now)."""
    now = T0 + dt
    st8, _ = live(state, now, RULE)
    w = RULE.width
    lo, hi = math.floor((now - RULE.reach) / w), math.floor(now / w) + AHEAD
    assert st8.width == w
    assert all(lo <= i <= hi and 0 < c <= MAX_COUNT for i, c in st8.buckets), st8
    assert [i for i, _ in st8.buckets] == sorted({i for i, _ in st8.buckets})
    assert 0 <= used(st8, now, RULE) <= MAX_COUNT
    longest = (AHEAD + 1) * w + RULE.reach + 2 * EPSILON
    for t in (now, now + 1.0, now + AHEAD * w):
        assert 0.0 <= wait(st8, t, now, RULE) <= longest
    again, ok = live(st8, now, RULE)
    assert ok and again == st8  # bounded once: the next look finds it sane


def test_a_corrupt_count_holds_one_window_at_most() -> None:
    now = T0
    hi = math.floor(now / RULE.width) + AHEAD
    state = WindowState(RULE.width, ((hi + 10**9, MAX_COUNT * 7), (hi, -5)))
    st8, ok = live(state, now, RULE)
    assert not ok and st8.total() == MAX_COUNT
    free_at = now + wait(st8, now, now, RULE)
    assert free_at <= now + (AHEAD + 1) * RULE.width + RULE.reach + 2 * EPSILON
    st9, _ = live(st8, free_at, RULE)
    assert gate(granted(free_at, free_at), free_at, st9, RULE)[0].granted


# -- divided --------------------------------------------------------------------------------------------


def test_divided() -> None:
    rule = WindowRule("s", "e", 300.0, 4800)
    assert divided(None, 3) is None
    assert divided(rule, 1) == rule and divided(rule, 0.5) == rule
    assert divided(rule, 3) == WindowRule("s", "e", 300.0, 1600)
    assert divided(rule, 7) == WindowRule("s", "e", 300.0, 685)
    assert divided(WindowRule("s", "e", 300.0, 2), 5) == WindowRule("s", "e", 300.0, 1)  # never 0 (off)
    off = WindowRule("s", "e", 300.0, 0)
    assert divided(off, 4) == off
    n = 3
    assert n * divided(rule, n).limit <= rule.limit  # type: ignore[union-attr]  # the sum is kept


# -- the property ---------------------------------------------------------------------------------------

# One step: a time step, then a grant of a class. A paced slot may be reserved ahead (the global schedule,
# up to three windows: beyond AHEAD buckets it must wait); an exempt slot goes now or a GCRA step later.
steps = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=4.0),
        st.sampled_from(["paced", "exempt"]),
        st.floats(min_value=0.0, max_value=30.0),
    ),
    min_size=1,
    max_size=120,
)
rules = st.builds(
    WindowRule,
    st.just("data.commoncrawl.org"),
    st.just("e"),
    st.sampled_from([1.0, 2.5, 10.0, 7.3]),
    st.integers(min_value=1, max_value=12),
)


@settings(max_examples=300, deadline=None)
@given(rules, steps, st.floats(min_value=0.0, max_value=1.0))
def test_no_trailing_window_holds_more_than_the_limit(
    rule: WindowRule, seq: list[tuple[float, str, float]], start: float
) -> None:
    state = WindowState()
    now = T0 + start
    slots: list[float] = []
    for dt, klass, ahead in seq:
        now += dt
        at = now + (ahead if klass == "paced" else min(ahead, 0.5))
        state, ok = live(state, now, rule)
        assert ok
        c, new = gate(granted(at, now), now, state, rule, deadline=now + 3 * rule.seconds)
        if new is not None:
            assert c.granted
            state = new
            slots.append(at)
        else:
            assert c.window and c.at >= at and c.wait > 0
    # Not only the window: any span of the window plus LATE, so arrivals up to LATE after their slots
    # (what Common Crawl counts) never overfill a window either.
    assert most_in_a_window(slots, rule.reach) <= rule.limit, (rule, sorted(slots))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.5, 10.0, 7.3]), min_size=1, max_size=4), steps, st.integers(1, 8))
def test_a_reload_never_lets_a_window_overfill(
    windows: list[float], seq: list[tuple[float, str, float]], limit: int
) -> None:
    """The window narrows while grants go on (reloads): every grant under a new rule still sees every count
    made under an old one, so no window of the new width around it holds more than the limit (of the grants
    made until then; later ones answer to their own rule). A wider window cannot count what the narrower
    one had already forgotten: that case is test_a_wider_window_keeps_every_count_until_its_own_end."""
    windows = sorted(windows, reverse=True)
    state = WindowState()
    now = T0
    slots: list[tuple[float, int]] = []  # (slot, which rule granted it)
    for k, (dt, klass, ahead) in enumerate(seq):
        seconds = windows[k * len(windows) // len(seq)]
        rule = WindowRule("s", "e", seconds, limit)
        now += dt
        # Reserved no further ahead than the narrowest window keeps buckets (live()'s stated limit).
        at = now + (min(ahead, AHEAD * windows[-1] / BUCKETS) if klass == "paced" else 0.0)
        state, ok = live(state, now, rule)
        assert ok
        c, new = gate(granted(at, now), now, state, rule)
        if new is not None:
            state = new
            slots.append((at, k * len(windows) // len(seq)))
    for k, (at, r) in enumerate(slots):
        seconds = windows[r]
        before = sorted(s for s, _ in slots[: k + 1])  # grants made later answer to their own rule
        assert most_around(before, at, seconds) <= limit, (windows, r, at - T0, before)


def most_around(ts: list[float], t: float, seconds: float) -> int:
    """The most of the sorted ``ts`` a closed window of ``seconds`` holding ``t`` holds: the busiest one
    starts on one of them, no earlier than ``t - seconds``."""
    starts = [s for s in ts if t - seconds <= s <= t]
    return max(bisect.bisect_right(ts, s + seconds) - bisect.bisect_left(ts, s) for s in starts)
