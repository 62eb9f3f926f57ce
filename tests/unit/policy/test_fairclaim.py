from politeproxy.policy.fairclaim import BACKLOG_TTL, FairAsk, FairState, fair_charge, fair_turn


def _run(asks: list[FairAsk], slots: int) -> dict[str, int]:
    s, got, now = FairState(), {a.pipeline: 0 for a in asks}, 0.0
    while sum(got.values()) < slots:
        for a in asks:  # every pipeline asks in turn, as proxies would
            if fair_turn(s, a, now) == 0.0:
                fair_charge(s, a)
                got[a.pipeline] += 1
        now += 0.01
    return got


def test_equal_shares() -> None:
    got = _run([FairAsk("x"), FairAsk("y"), FairAsk("z")], 90)
    assert all(abs(n - 30) <= 1 for n in got.values()), got


def test_weights_one_to_two() -> None:
    got = _run([FairAsk("a", 1.0), FairAsk("b", 2.0)], 90)
    assert abs(got["b"] - 60) <= 2, got


def test_idle_pipeline_keeps_no_credit() -> None:
    s = FairState()
    assert fair_turn(s, FairAsk("x"), 0.0) == 0.0
    fair_charge(s, FairAsk("x"))
    assert fair_turn(s, FairAsk("y"), 0.1) == 0.0  # y is behind x: its turn
    assert fair_turn(s, FairAsk("x"), 0.1) > 0  # x out of turn, retry soon
    assert fair_turn(s, FairAsk("x"), 0.2 + BACKLOG_TTL) == 0.0  # y's mark expired


def test_bad_weight_counts_as_one() -> None:
    assert FairAsk("x", float("nan")).w() == 1.0
