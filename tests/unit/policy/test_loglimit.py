"""The one log-rate limiter (policy/loglimit.py): exact counts on an injected clock, no logger.

Per key a window of ``window`` seconds opens at an event; its first ``burst`` events are logged, the rest
held, and the verdict that opens the key's next window carries the count held and the window's span."""

from __future__ import annotations

import math

import pytest

from politeproxy.policy.loglimit import HOLD, LOG, NEW, LogLimiter, Verdict, error_key, error_line


def run(limiter: LogLimiter, key: str, times: list[float]) -> list[Verdict]:
    return [limiter.hit(key, t) for t in times]


def test_a_burst_passes_per_window_and_the_rest_are_summed_up_when_the_next_opens() -> None:
    lim = LogLimiter(burst=3, window=10.0, max_keys=8)
    first = run(lim, "a", [0.0 + i * 0.1 for i in range(50)])  # 50 events within 5 s
    assert first[:3] == [NEW, LOG, LOG] and first[3:] == [HOLD] * 47
    assert lim.held() == 47
    assert lim.hit("a", 10.5) == Verdict(True, held=47, span=10.5)  # the next window's first line
    assert lim.held() == 0
    assert run(lim, "a", [11.0, 12.0, 13.0]) == [LOG, LOG, HOLD]


def test_windows_open_at_an_event_not_on_a_fixed_grid() -> None:
    lim = LogLimiter(burst=1, window=60.0, max_keys=8)
    verdicts = run(lim, "e", [float(t) for t in range(131)])  # one a second for 130 s
    logged = [(t, v) for t, v in enumerate(verdicts) if v.log]
    assert logged == [
        (0, NEW),
        (60, Verdict(True, held=59, span=60.0)),
        (120, Verdict(True, held=59, span=60.0)),
    ]
    assert lim.held() == 10  # 121..130 wait for the next window
    assert lim.hit("e", 500.0) == Verdict(True, held=10, span=380.0)
    assert lim.hit("e", 600.0) == Verdict(True, held=0, span=100.0)  # a lone repeat opens one too


def test_keys_are_counted_apart() -> None:
    lim = LogLimiter(burst=2, window=10.0, max_keys=8)
    assert run(lim, "a", [0.0, 0.0, 0.0]) == [NEW, LOG, HOLD]
    assert run(lim, "b", [0.0, 0.0]) == [NEW, LOG]  # another key is not held back
    assert lim.held() == 1 and len(lim) == 2


def test_the_table_is_bounded_and_forgets_the_window_opened_longest_ago() -> None:
    lim = LogLimiter(burst=1, window=10.0, max_keys=4)
    for i in range(100):
        lim.hit(f"k{i}", 0.0)
    assert len(lim) == 4
    assert lim.hit("k0", 1.0) == NEW  # forgotten, with its count
    lim = LogLimiter(burst=1, window=10.0, max_keys=2)
    lim.hit("a", 0.0)
    lim.hit("b", 1.0)
    lim.hit("a", 20.0)  # a's window opens again: now b's is the oldest
    lim.hit("c", 21.0)
    assert lim.hit("a", 22.0) == HOLD and lim.hit("b", 22.0) == NEW


@pytest.mark.parametrize("back", [-1.0, math.nan])
def test_a_clock_that_goes_back_or_breaks_opens_a_window_rather_than_muting_the_key(back: float) -> None:
    lim = LogLimiter(burst=1, window=10.0, max_keys=4)
    run(lim, "a", [100.0, 101.0])
    v = lim.hit("a", 100.0 + back if not math.isnan(back) else back)
    assert v.log and v.held == 1 and not v.new


def test_clear_forgets_every_count() -> None:
    lim = LogLimiter(burst=1, window=10.0, max_keys=4)
    run(lim, "a", [0.0, 1.0, 2.0])
    assert lim.held() == 2
    lim.clear()
    assert lim.held() == 0 and len(lim) == 0 and lim.hit("a", 3.0) == NEW


@pytest.mark.parametrize(
    ("burst", "window", "keys"), [(0, 1.0, 1), (1, 0.0, 1), (1, math.nan, 1), (1, 1.0, 0)]
)
def test_a_limiter_that_would_never_log_is_refused(burst: int, window: float, keys: int) -> None:
    with pytest.raises(ValueError):
        LogLimiter(burst, window, keys)


def test_error_lines_are_one_line_and_keyed_without_numbers() -> None:
    line = error_line("store", RuntimeError("bad record 17\n  at offset 4096"))
    assert line == "store: RuntimeError: bad record 17 at offset 4096"
    assert error_key(line) == error_key(error_line("store", RuntimeError("bad record 18 at offset 0")))
    assert error_key(line) != error_key(error_line("store", OSError("bad record 17 at offset 4096")))
    assert len(error_line("x", ValueError("y" * 1000))) == len("x: ValueError: ") + 300
