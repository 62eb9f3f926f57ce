"""Property: weighted backlogged pipelines spread over several proxies, the proxies asking in random order
(pure simulation of the shared store's fair step, no sockets). Each proxy asks for one head at a time and
marks its whole backlog, and serves the pipeline whose turn the store names when it has it, as the
dispatcher does."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.policy.fairclaim import FairAsk, FairState, fair_charge, fair_turn

BOUND = 3.0  # slots: a pipeline's count in any 100 consecutive slots is within 3 of 100 * w / sum(w)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2)), min_size=2, max_size=5),
    st.integers(0, 2**32),
)
def test_shares_in_every_100_slots(pipes: list[tuple[int, int]], seed: int) -> None:
    """Every 100 consecutive slots once each proxy has asked (all pipelines backlogged)."""
    rng = random.Random(seed)
    weight = {f"p{i}": float(w) for i, (w, _) in enumerate(pipes)}
    owned: dict[str, list[str]] = {}
    for i, (_, proxy) in enumerate(pipes):
        owned.setdefault(f"proxy{proxy}", []).append(f"p{i}")
    heads = {proxy: 0 for proxy in owned}  # each proxy's own rotation between its pipelines
    s, order, now = FairState(), [], 0.0
    asked: set[str] = set()
    start = 0  # the slots before every proxy has asked once are the warm-up: a pipeline whose proxy has
    # not asked yet is not backlogged, so it has no share of them (seed 276 of 3 proxies: 30 of 100)
    while len(order) < 300 + start:
        proxy = rng.choice(sorted(owned))  # whichever proxy's claim reaches the store next
        if proxy not in asked:
            asked.add(proxy)
            start = len(order)
        mine = owned[proxy]
        p = mine[heads[proxy] % len(mine)]
        ask = FairAsk(p, weight[p], proxy, tuple(mine))
        wait, turn = fair_turn(s, ask, now)
        if wait == 0.0:
            fair_charge(s, ask)
            order.append(p)
            heads[proxy] += 1
        elif turn in mine:
            heads[proxy] = mine.index(turn)
        now += 0.001
    total = sum(weight.values())
    for i in range(start, len(order) - 100):
        win = order[i : i + 100]
        for p, w in weight.items():
            assert abs(win.count(p) - 100 * w / total) <= BOUND, (p, win.count(p), pipes)
