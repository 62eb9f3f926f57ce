"""Behind the permit (issue 23, item 3): the note a refusal carries (why the host rests), the retry decision
on the pacer's settings and clock, the store's name and state in the snapshot, and no schedule-store call
outside the pacing package (the proxy and app.py ask the pacer)."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest

import politeproxy
from politeproxy.pacing.pacer import Pacer, PacingSettings, WaitTooLong
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.stores.base import Store
from politeproxy.stores.failover import FailoverStore
from politeproxy.stores.memory import MemoryStore
from tests.support.turns import paced
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
B = "index.commoncrawl.org"
PACKAGE = Path(politeproxy.__file__).parent


def settings(**kw: object) -> PacingSettings:
    # index_rest 0: B stands for any host here (its rest after a warning is tested in test_index_rest.py)
    base: dict[str, object] = dict(gap=0.125, max_wait=5.0, host_intervals=(), retries=2, index_rest=0.0)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


async def refusal(pacer: Pacer, host: str, klass: Klass) -> WaitTooLong:
    with pytest.raises(WaitTooLong) as e:
        async with pacer.permit(host, klass):
            pass
    return e.value


async def test_a_refusal_says_why_the_host_rests(vclock: VirtualClock) -> None:
    policy = BackoffPolicy(block_hold=60.0, adaptive=False)
    pacer = Pacer(MemoryStore(clock=vclock, rand=lambda: 0.0), settings(backoff=policy), monotonic=vclock)
    try:
        async with pacer.permit(A, Klass.PACED) as p:
            await p.answered(503, "30")  # backing off for 30 s
        paced = await refusal(pacer, A, Klass.PACED)
        assert paced.why == f"{A} is paced and this request would wait 30.0s"  # the pacer's own words
        # one cause, one text (issue 41): the rest is the whole message, since and until when, and why
        assert re.fullmatch(rf"{A} is backing off until \S+Z \(since \S+Z: 503 from upstream\)", paced.note)
        assert paced.message == paced.note
        async with pacer.permit(B, Klass.PACED) as p:
            await p.answered(403, None)  # a block: exempt reads wait it out too
        exempt = await refusal(pacer, B, Klass.EXEMPT)
        assert exempt.note.startswith(f"{B} is blocked until ") and exempt.message == exempt.note
    finally:
        await pacer.close()


async def test_a_refusal_of_a_host_that_does_not_rest_has_no_note(vclock: VirtualClock) -> None:
    pacer = Pacer(MemoryStore(clock=vclock, rand=lambda: 0.0), settings(max_queue=1), monotonic=vclock)
    try:
        await paced(pacer, A)
        waiting = asyncio.create_task(paced(pacer, A))  # the next slot for A is 0.125 s away: it waits
        await asyncio.sleep(0)
        e = await refusal(pacer, A, Klass.PACED)  # a full queue refuses
        assert e.reason == "queue_full" and e.note == "" and e.message == e.why
        await waiting
    finally:
        await pacer.close()


async def test_the_permit_decides_the_retry_on_the_pacers_settings_and_clock(vclock: VirtualClock) -> None:
    pacer = Pacer(MemoryStore(clock=vclock, rand=lambda: 0.0), settings(max_wait=10.0), monotonic=vclock)
    try:
        async with pacer.permit(A, Klass.PACED) as p:
            assert p.retry("GET", False, 0).why == "not a throttle"  # nothing answered yet
            await p.answered(429, "2")
            assert (p.retry("GET", False, 0).retry, p.retry("GET", False, 0).after) == (True, 2.0)
            assert p.retry("GET", False, 1).retry  # pacing.retries = 2
            assert p.retry("GET", False, 2).why == "no retries left"
            assert p.retry("POST", False, 0).why == "not replayable"
            assert p.retry("GET", True, 0).why == "not replayable"
        async with pacer.permit(B, Klass.PACED, vclock() - 9.0) as p:  # arrived 9 s ago
            await p.answered(503, "1")
            assert p.retry("GET", False, 0).why == "would exceed max_wait"
        async with pacer.permit(B, Klass.EXEMPT) as p:
            await p.answered(403, None)
            assert p.retry("GET", False, 0).why == "a block is never retried"
        assert vclock() - T0 < 10.0
    finally:
        await pacer.close()


async def test_the_snapshot_names_the_store_and_whether_it_is_degraded() -> None:
    class Shared(MemoryStore):
        name = "shared"

    store = FailoverStore(Shared(), MemoryStore())
    pacer = Pacer(store, settings())
    try:
        snap = pacer.snapshot()
        assert (snap.store, snap.degraded) == ("shared", False)
        store.degraded = True
        snap = pacer.snapshot()
        assert (snap.store, snap.degraded) == ("memory", True)
        assert Pacer(MemoryStore(), settings()).snapshot().store == "memory"
    finally:
        await pacer.close()


# The schedule store's methods, by name (close is wiring: app.py closes the store it made).
STORE_CALLS = {n for n, v in vars(Store).items() if callable(v) and not n.startswith("_")} - {"close"}


def receiver(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


@pytest.mark.parametrize(
    "path",
    # commands/simloop.py: politeproxy simulate runs its own MemoryStore on a virtual clock, the store's own
    # claims on purpose (issue 24 item 6); it never touches a running proxy's store.
    sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] not in ("pacing", "stores") and p.name != "simloop.py"
    ),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_nothing_outside_the_pacing_package_calls_the_schedule_store(path: Path) -> None:
    calls = [
        (n.lineno, receiver(n.func.value), n.func.attr)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in STORE_CALLS
    ]
    assert not [c for c in calls if "store" in c[1]], calls
