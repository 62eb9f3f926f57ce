"""The status chart's last bucket (issue 26): the step in progress is reported from what it holds so far,
so the chart never ends in a false zero; and the overall rate comes over 10 s and over a minute."""

from __future__ import annotations

from politeproxy.observe.status import History


def test_the_step_in_progress_is_a_partial_point() -> None:
    h = History(step=5.0)
    assert h.partial(100.0, 1e9, 0, 1.0, 0) is None  # nothing sampled yet
    h.sample(100.0, 1e9, 10, 1.0, 3)
    assert h.partial(100.2, 1e9 + 0.2, 10, 1.0, 3) is None  # a tenth of a step has not passed
    point = h.partial(102.0, 1e9 + 2.0, 14, 1.0, 3)
    assert point == [1e9 + 2.0, 2.0, 1.0, 3]  # 4 grants in 2 s so far: 2/s, not 0
    assert len(h.points) == 0  # a partial point is not kept: the next sample makes the real one
