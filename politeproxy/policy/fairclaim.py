"""The fair step a shared store takes inside its claim (issue 27 item 1; pure: times are passed in).

A claim carries a ``FairAsk`` (pipeline and weight). The store keeps, per pipeline, a finish tag and a
"backlogged" mark that expires ``BACKLOG_TTL`` seconds after that pipeline's last ask, plus one global
virtual clock ``V``. A slot goes to the backlogged pipeline with the smallest start tag ``max(V, finish)``
(ties to the asker); an ask out of turn gets no slot and a short, bounded retry. Not yet wired into the
stores: this is the arithmetic they will persist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

BACKLOG_TTL = 3.0  # seconds a pipeline counts as backlogged after its last ask
RETRY = 0.02  # seconds an out-of-turn ask waits before asking again (bounded by RETRY_MAX)
RETRY_MAX = 0.25
MAX_PIPELINES = 1024  # records kept; the oldest marks are dropped first


@dataclass(frozen=True)
class FairAsk:
    pipeline: str
    weight: float = 1.0

    def w(self) -> float:
        return self.weight if math.isfinite(self.weight) and self.weight > 0 else 1.0


@dataclass
class FairState:
    vtime: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    marked: dict[str, float] = field(default_factory=dict)  # pipeline -> when its mark expires


def _start(s: FairState, p: str) -> float:
    f = s.finish.get(p, s.vtime)
    return max(s.vtime, f if math.isfinite(f) else s.vtime)


def fair_turn(s: FairState, ask: FairAsk, now: float) -> float:
    """Mark ``ask`` backlogged at ``now``; 0.0 when it is its turn, else seconds until it asks again."""
    for p in [p for p, exp in s.marked.items() if not exp > now]:
        del s.marked[p]
        s.finish.pop(p, None)  # an idle pipeline keeps no credit
    s.marked.pop(ask.pipeline, None)
    s.marked[ask.pipeline] = now + BACKLOG_TTL
    while len(s.marked) > MAX_PIPELINES:
        old = next(iter(s.marked))
        del s.marked[old]
        s.finish.pop(old, None)
    mine = _start(s, ask.pipeline)
    best = min(_start(s, p) for p in s.marked)
    return 0.0 if mine <= best + 1e-12 else min(RETRY_MAX, RETRY)


def fair_charge(s: FairState, ask: FairAsk) -> None:
    """``ask`` got the slot: V moves to its start tag, its finish tag on by 1 / weight."""
    st = _start(s, ask.pipeline)
    s.vtime = st
    s.finish[ask.pipeline] = st + 1.0 / ask.w()
