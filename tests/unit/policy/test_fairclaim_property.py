"""Property: proxies ask in random order for weighted backlogged pipelines (pure simulation, no sockets)."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.policy.fairclaim import FairAsk, FairState, fair_charge, fair_turn

BOUND = 3.0  # slots: a pipeline's count in any 100 consecutive slots is within 3 of 100 * w / sum(w)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=2, max_size=5), st.integers(0, 2**32))
def test_shares_in_every_100_slots(weights: list[int], seed: int) -> None:
    rng = random.Random(seed)
    asks = [FairAsk(f"p{i}", float(w)) for i, w in enumerate(weights)]
    s, order, now = FairState(), [], 0.0
    while len(order) < 300:
        a = rng.choice(asks)  # whichever proxy's ask reaches the store next
        if fair_turn(s, a, now) == 0.0:
            fair_charge(s, a)
            order.append(a.pipeline)
        now += 0.001
    total = sum(weights)
    for i in range(len(order) - 100):
        win = order[i : i + 100]
        for a in asks:
            assert abs(win.count(a.pipeline) - 100 * a.weight / total) <= BOUND
