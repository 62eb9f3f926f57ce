"""The pure fair step (policy/fairclaim.py) with injected times: shares, weights, marks and bounds."""

import math

from politeproxy.policy.fairclaim import (
    BACKLOG_TTL,
    MAX_MARKS,
    RETRY,
    FairAsk,
    FairState,
    fair_charge,
    fair_gate,
    fair_turn,
    sane_state,
)
from politeproxy.policy.slots import Claim, Outcome


def _run(asks: list[FairAsk], slots: int) -> dict[str, int]:
    s, got, now = FairState(), {a.pipeline: 0 for a in asks}, 0.0
    while sum(got.values()) < slots:
        for a in asks:  # every pipeline asks in turn, as proxies would
            if fair_turn(s, a, now)[0] == 0.0:
                fair_charge(s, a)
                got[a.pipeline] += 1
        now += 0.01
    return got


def test_equal_shares() -> None:
    got = _run([FairAsk("x", proxy="A"), FairAsk("y", proxy="B"), FairAsk("z", proxy="C")], 90)
    assert all(abs(n - 30) <= 1 for n in got.values()), got


def test_weights_one_to_two() -> None:
    got = _run([FairAsk("a", 1.0, "A"), FairAsk("b", 2.0, "B")], 90)
    assert abs(got["b"] - 60) <= 2, got


def test_two_pipelines_on_one_proxy_mark_each_other() -> None:
    # B holds y and z; it asks for one at a time but its backlog marks both: x on A gets a third, not a half
    s, got = FairState(), {"x": 0, "y": 0, "z": 0}
    heads = ["y", "z"]
    for i in range(300):
        now = i * 0.01
        a = FairAsk("x", proxy="A")
        b = FairAsk(heads[0], proxy="B", backlog=("y", "z"))
        for ask in (a, b):
            wait, turn = fair_turn(s, ask, now)
            if wait == 0.0:
                fair_charge(s, ask)
                got[ask.pipeline] += 1
                if ask is b:
                    heads.reverse()
            elif ask is b and turn in ("y", "z") and turn != heads[0]:
                heads.reverse()  # the dispatcher serves the pipeline whose turn it is
        if sum(got.values()) >= 90:
            break
    assert all(abs(n - 30) <= 2 for n in got.values()), got


def test_a_pipeline_whose_last_request_left_stops_counting_at_once() -> None:
    s = FairState()
    assert fair_turn(s, FairAsk("y", proxy="B"), 0.0)[0] == 0.0
    fair_charge(s, FairAsk("y", proxy="B"))
    assert fair_turn(s, FairAsk("x", proxy="A"), 0.0)[0] == 0.0
    fair_charge(s, FairAsk("x", proxy="A"))
    fair_charge(s, FairAsk("x", proxy="A"))  # x is ahead: y's turn while B has y backlogged
    wait, turn = fair_turn(s, FairAsk("x", proxy="A"), 0.1)
    assert wait >= RETRY and turn == "y"
    # B's next claim is for another pipeline: y's mark is gone with it, so x is not held behind y
    assert fair_turn(s, FairAsk("w", proxy="B"), 0.1)[0] == 0.0
    fair_charge(s, FairAsk("w", proxy="B"))
    assert fair_turn(s, FairAsk("x", proxy="A"), 0.1)[0] == 0.0


def test_a_dead_proxys_marks_expire() -> None:
    s = FairState()
    fair_turn(s, FairAsk("y", proxy="B"), 0.0)  # B asked once, then died
    fair_charge(s, FairAsk("x", proxy="A"))
    assert fair_turn(s, FairAsk("x", proxy="A"), 0.1)[0] > 0
    assert fair_turn(s, FairAsk("x", proxy="A"), 0.1 + BACKLOG_TTL)[0] == 0.0


def test_idle_pipeline_keeps_no_credit() -> None:
    s = FairState()
    for _ in range(50):  # x alone for 50 slots
        fair_turn(s, FairAsk("x", proxy="A"), 0.0)
        fair_charge(s, FairAsk("x", proxy="A"))
    # y, idle all along, comes in: it starts at V, one slot ahead of x at most, never 50
    got = {"x": 0, "y": 0}
    for i in range(20):
        for a in (FairAsk("x", proxy="A"), FairAsk("y", proxy="B")):
            if fair_turn(s, a, 1.0 + i * 0.01)[0] == 0.0:
                fair_charge(s, a)
                got[a.pipeline] += 1
    assert abs(got["x"] - got["y"]) <= 2, got


def test_gate_turns_a_grant_into_not_your_turn() -> None:
    s = FairState()
    fair_charge(s, FairAsk("x", proxy="A"))
    fair_turn(s, FairAsk("y", proxy="B"), 100.0)
    granted = Claim(Outcome.GRANTED, 0.4, 100.4)
    c = fair_gate(s, granted, FairAsk("x", proxy="A"), 0.2, 100.0)
    assert c.outcome is Outcome.NOT_YOUR_TURN and c.turn == "y"
    assert abs(c.wait - 0.2) < 1e-9  # until the slot reserved last comes up (0.4 - one gap)
    late = fair_gate(s, Claim(Outcome.GRANTED, 3.0, 103.0), FairAsk("x", proxy="A"), 0.2, 100.0)
    assert abs(late.wait - 0.25) < 1e-9  # asks again within RETRY_MAX: the turn may have moved
    assert fair_gate(s, granted, None, 0.2, 100.0) is granted
    assert fair_gate(s, granted, FairAsk("x", proxy="A"), 0.0, 100.0) is granted  # no schedule, no turns


def test_tables_stay_bounded() -> None:
    s = FairState()
    for i in range(MAX_MARKS + 200):
        a = FairAsk(f"p{i}", proxy=f"q{i}")
        fair_turn(s, a, i * 1e-4)
        fair_charge(s, a)
    assert len(s.marks) <= MAX_MARKS and len(s.finish) <= MAX_MARKS


def test_sane_state_tames_a_hostile_record() -> None:
    bad = FairState(float("nan"), {"a": 1e300, "b": 0.5}, {("A", "a"): 1e300, ("A", "b"): math.inf})
    s, ok = sane_state(bad, 10.0, 0.2)
    assert not ok and s.vtime == 0.0 and s.finish == {"b": 0.5}
    assert all(exp <= 10.0 + BACKLOG_TTL + 1 for exp in s.marks.values())


def test_bad_weight_counts_as_one() -> None:
    assert FairAsk("x", float("nan")).w() == 1.0
    assert FairAsk("x", -2.0).w() == 1.0
