"""The fair step a shared store takes inside its claim (issue 27 item 1; pure: times are passed in).

Start-time fair queuing (``policy.fairness``) across every proxy on one store. A paced claim carries a
``FairAsk``: the pipeline of the request at the head of that proxy's queue, its weight, and the pipelines
that proxy has requests ready for (its backlog). The store keeps one virtual clock ``V``, a finish tag per
pipeline, and a *mark* per (proxy, pipeline) that one proxy's backlog holds. Each claim replaces the asking
proxy's marks with its backlog, so a pipeline whose last request left stops counting at once (no stall
behind a pipeline that went idle); a mark also expires ``ttl`` seconds after its proxy's last claim (a proxy
that died). The slot goes to the marked pipeline with the smallest start tag ``max(V, finish)``, ties to the
asker; an ask out of turn reserves nothing and is told whose turn it is and when to ask again. A pipeline
that comes back starts at ``max(V, its finish)``: idle, it banks no credit, and a client sending one request
at a time gains nothing by its gaps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from politeproxy.policy.slots import Claim, Outcome
from politeproxy.policy.table import from_table

BACKLOG_TTL = 3.0  # seconds a proxy's marks outlive its last claim, at least (a proxy that died)
TTL_GAPS = 16.0  # ... and at least this many global gaps: a backlogged proxy claims once per own slot
TTL_MAX = 60.0
RETRY = 0.02  # seconds: the least an out-of-turn ask waits before asking again
RETRY_MAX = 0.25  # the most, unless the gap is longer (then one gap)
MAX_MARKS = 1024  # (proxy, pipeline) marks kept; those expiring first are dropped first
MAX_BACKLOG = 32  # pipelines one claim may mark (a proxy's ready lines: a handful)
MAX_LEAD = 1e4  # a finish tag further than this ahead of V is not one any weight gives (a corrupt record)
EPS = 1e-9


def weight_of(w: float) -> float:
    return w if math.isfinite(w) and 0 < w <= 1e6 else 1.0


@dataclass(frozen=True)
class FairAsk:
    pipeline: str
    weight: float = from_table("pipelines.*.weight")
    proxy: str = ""  # the asking proxy (its dispatcher's random id): its marks are its own
    backlog: tuple[str, ...] = ()  # the pipelines with requests ready on the asking proxy

    def w(self) -> float:
        return weight_of(self.weight)

    def marks(self) -> list[str]:
        """The pipelines this ask marks: its backlog (bounded) and always the asker."""
        names = [p for p in self.backlog[:MAX_BACKLOG] if p != self.pipeline]
        return [self.pipeline, *names]


@dataclass
class FairState:
    vtime: float = 0.0
    finish: dict[str, float] = field(default_factory=dict)
    marks: dict[tuple[str, str], float] = field(default_factory=dict)  # (proxy, pipeline) -> expires at


def mark_ttl(gap: float) -> float:
    return min(TTL_MAX, max(BACKLOG_TTL, TTL_GAPS * gap))


def retry_after(soon: float, gap: float) -> float:
    """How long an out-of-turn ask waits: until the slot reserved last comes up (``soon``), bounded."""
    top = max(RETRY_MAX, gap)
    return min(top, max(RETRY, soon)) if math.isfinite(soon) else RETRY


def _start(s: FairState, p: str) -> float:
    return max(s.vtime, s.finish.get(p, s.vtime))


def _mark(s: FairState, proxy: str, ask: FairAsk, now: float, ttl: float) -> None:
    mine = ask.marks()
    for k, exp in list(s.marks.items()):
        if not exp > now or (k[0] == proxy and k[1] not in mine):
            del s.marks[k]
    for p in mine:
        s.marks.pop((proxy, p), None)  # re-inserted last: the dict stays in order of expiry, roughly
        s.marks[(proxy, p)] = now + ttl
    while len(s.marks) > MAX_MARKS:
        del s.marks[min(s.marks, key=lambda k: s.marks[k])]
    # A finish tag not ahead of V changes nothing (the start is max(V, finish)): such tags are dropped,
    # so the table holds the pipelines served in about the last round. Idle, a pipeline banks nothing.
    for p in [p for p, f in s.finish.items() if f <= s.vtime]:
        del s.finish[p]
    _bound_finish(s)


def _bound_finish(s: FairState) -> None:
    while len(s.finish) > MAX_MARKS:
        del s.finish[min(s.finish, key=lambda p: s.finish[p])]  # the least ahead of V: the least lost


def fair_turn(
    s: FairState, ask: FairAsk, now: float, soon: float = 0.0, gap: float = 0.0
) -> tuple[float, str]:
    """Mark the asking proxy's backlog at ``now``; ``(0.0, ask.pipeline)`` when it is the asker's turn, else
    ``(seconds until it asks again, the pipeline whose turn it is)``. ``soon``: seconds until the slot
    reserved last comes up (its proxy asks then); ``gap``: the global gap."""
    _mark(s, ask.proxy, ask, now, mark_ttl(gap))
    best = min([_start(s, p) for _, p in s.marks], default=math.inf)
    if _start(s, ask.pipeline) <= best + EPS:
        return 0.0, ask.pipeline
    # Ties go to the asker's own backlog first: two proxies each told the other's tied pipeline would
    # both wait for the other (a hypothesis example found that deadlock).
    own = [p for p in ask.marks() if _start(s, p) <= best + EPS]
    turn = own[0] if own else min(p for _, p in s.marks if _start(s, p) <= best + EPS)  # the Lua's order
    return retry_after(soon, gap), turn


def fair_charge(s: FairState, ask: FairAsk) -> None:
    """``ask`` got the slot: V moves to its start tag, its finish tag on by 1 / weight."""
    st = _start(s, ask.pipeline)
    s.vtime = st
    s.finish[ask.pipeline] = st + 1.0 / ask.w()
    _bound_finish(s)


def fair_gate(s: FairState, c: Claim, ask: FairAsk | None, gap: float, now: float) -> Claim:
    """A claim the slot rules granted, through the fair step: out of turn it becomes ``NOT_YOUR_TURN``
    (nothing reserved). Without an ask or a gap (no shared schedule) the claim is unchanged."""
    if ask is None or not gap > 0 or not c.granted:  # (NaN is no gap)
        return c
    wait, turn = fair_turn(s, ask, now, c.wait - gap, gap)
    if wait <= 0:
        return c
    return Claim(Outcome.NOT_YOUR_TURN, wait, c.at - c.wait + wait, turn=turn)


def sane_state(s: FairState, now: float, gap: float) -> tuple[FairState, bool]:
    """A state read from a store, within the bounds any real run gives (a corrupt or hostile record is
    tamed, never trusted): V finite and not negative, finish tags at most ``MAX_LEAD`` ahead of V, marks
    expiring within one ttl of now, at most ``MAX_MARKS``. Returns the state and whether it was sane."""
    ok = True
    v = s.vtime
    if not (math.isfinite(v) and v >= 0):
        v, ok = 0.0, False
    finish: dict[str, float] = {}
    for p, f in s.finish.items():
        if not (math.isfinite(f) and v - MAX_LEAD <= f <= v + MAX_LEAD):
            ok = False
            continue
        finish[p] = f
    top = now + mark_ttl(gap) + 1.0
    marks: dict[tuple[str, str], float] = {}
    for k, exp in s.marks.items():
        if not math.isfinite(exp) or exp > top:
            ok = False
            exp = now + mark_ttl(gap)
        marks[k] = exp
    if len(marks) > MAX_MARKS or len(finish) > MAX_MARKS:
        ok = False
        marks = dict(sorted(marks.items(), key=lambda kv: kv[1])[-MAX_MARKS:])
        finish = dict(sorted(finish.items(), key=lambda kv: kv[1])[-MAX_MARKS:])
    return FairState(v, finish, marks), ok
