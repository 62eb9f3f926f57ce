"""Heartbeat records (issue 27 item 2), pure: built, bounded, decoded from damage, judged by a given clock."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.policy.heartbeat import (
    LIVE_FOR,
    MAX_PIPELINES,
    MAX_PROXIES,
    MAX_TEXT,
    decode,
    live,
    make_beat,
    multiplier,
    proxy_id,
)


def _beat(ident: str = "h:1:100", at: float = 1000.0, **queued: int) -> Any:
    return make_beat(ident, "127.0.0.1:8080", "0.1.0", at, 900.0, queued)


def test_round_trip_and_row() -> None:
    b = _beat(a=3, b=0)
    assert decode(b.encode()) == b
    row = b.row(1001.5, me="h:1:100")
    assert row["self"] and row["last_beat_s"] == 1.5 and row["queued"] == 3
    assert row["pipelines"] == [{"pipeline": "a", "queued": 3}, {"pipeline": "b", "queued": 0}]


def test_live_by_the_given_clock() -> None:
    b = _beat(at=1000.0)
    assert [x.id for x in live([b], 1000.0 + LIVE_FOR)] == ["h:1:100"]
    assert live([b], 1000.0 + LIVE_FOR + 0.1) == []
    assert live([b], 1000.0 - LIVE_FOR - 0.1) == []  # far in the future: skew or damage, not live


def test_newest_per_id_and_bounded() -> None:
    old, new = _beat(at=999.0), _beat(at=1000.0, a=1)
    assert live([new, old], 1000.0) == [new]
    many = [_beat(f"p{i:03d}", at=1000.0) for i in range(MAX_PROXIES + 10)]
    assert len(live(many, 1000.0)) == MAX_PROXIES


def test_summary_is_bounded_and_clean() -> None:
    queued = {f"p{i}": i for i in range(50)} | {'bad"name\n' + "x" * 200: 99}
    b = make_beat("x" * 500, "l" * 500, "v", 1.0, 0.0, queued)
    assert len(b.pipelines) == MAX_PIPELINES and b.pipelines_omitted == 51 - MAX_PIPELINES
    assert b.pipelines[0][1] == 99 and '"' not in b.pipelines[0][0] and len(b.pipelines[0][0]) <= 64
    assert len(b.id) == MAX_TEXT and len(b.listen) == MAX_TEXT


def test_damaged_records_are_none_or_bounded() -> None:
    for bad in (
        None,
        [],
        "x",
        {"id": 1},
        {"id": "a", "at": math.nan, "started": 0},
        {"id": "a", "at": -1, "started": 0},
        {"id": "", "at": 1, "started": 1},
        {"id": "a", "at": True, "started": 1},
    ):
        assert decode(bad) is None
    b = decode(
        {
            "id": "a/../../etc",
            "at": 5,
            "started": 1,
            "queued": -4,
            "pipelines": [["ok", 2], ["x", "y"], [3, 4], "z"] * 20,
        }
    )
    assert b is not None and b.queued == 0 and len(b.pipelines) <= MAX_PIPELINES
    assert ("ok", 2) in b.pipelines and ("x", 0) in b.pipelines


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
        lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=10), c, max_size=8),
        max_leaves=30,
    )
)
def test_decode_never_raises(raw: Any) -> None:
    b = decode(raw) if not isinstance(raw, dict) else decode({"id": "a", "at": 1, "started": 1, **raw})
    if b is not None:
        assert len(b.id) <= MAX_TEXT and len(b.pipelines) <= MAX_PIPELINES and math.isfinite(b.at)


def test_multiplier_floor() -> None:
    assert multiplier(1, 0) == 1.0
    assert multiplier(4, 3) == 4.0  # expected_proxies is a floor
    assert multiplier(2, 5) == 5.0
    assert proxy_id("host", 12, 100.7) == "host:12:100"
