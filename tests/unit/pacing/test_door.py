"""The pacer's one door (issue 23): ``permit`` (with the probe, the refusal's note and the retry decision
inside), ``snapshot`` (the one read path, a copy), ``start``/``close``/``reload``, and nothing else public
but the proxy's few small calls."""

from __future__ import annotations

import asyncio

from politeproxy.pacing.pacer import Pacer, PacingSettings
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.stores.memory import MemoryStore
from tests.support.turns import paced
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

A = "data.commoncrawl.org"
B = "index.commoncrawl.org"

# The public surface after issue 23; a new public name is a decision, not an accident.
DOOR = {"permit", "snapshot", "start", "close", "reload", "settings", "monotonic"}
# forward.py bounds a client's name before the cache answers; host records for status, the gauges and robots
PROXY_CALLS = {"pipeline_of", "host_view", "set_crawl_delay"}


def settings(**kw: object) -> PacingSettings:
    # index_rest 0: B stands for any host here (its rest after a warning is tested in test_index_rest.py)
    base: dict[str, object] = dict(gap=0.125, max_wait=5.0, host_intervals=(), index_rest=0.0)
    base.update(kw)
    return PacingSettings(**base)  # type: ignore[arg-type]


def test_the_public_surface_is_the_door() -> None:
    public = {n for n in dir(Pacer) if not n.startswith("_")}
    assert public <= DOOR | PROXY_CALLS, public - DOOR - PROXY_CALLS


async def test_the_permit_after_a_block_is_the_probe(vclock: VirtualClock) -> None:
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, settings(backoff=BackoffPolicy(block_hold=0.5, adaptive=False)), monotonic=vclock)
    try:
        async with pacer.permit(A, Klass.PACED) as p:
            assert not p.probe
            delay = await p.answered(403, None)
        assert delay is not None and delay.block and delay.seconds == 0.5
        async with pacer.permit(A, Klass.PACED) as p:
            assert p.probe and p.waited == 0.5 and vclock() - T0 == 0.5  # the one request after the hold
            await p.answered(200, None)
        async with pacer.permit(A, Klass.PACED) as p:
            assert not p.probe  # the probe's success resumed the host
        async with pacer.permit(B, Klass.EXEMPT) as p:
            assert not p.probe and p.klass is Klass.EXEMPT
    finally:
        await pacer.close()


async def test_the_snapshot_is_a_copy_with_the_pacers_own_estimate(vclock: VirtualClock) -> None:
    store = MemoryStore(clock=vclock, rand=lambda: 0.0)
    pacer = Pacer(store, settings(gap=1.0, max_wait=60.0), monotonic=vclock)
    await pacer._record(B, 503, 4.0)  # B rests: its line is not ahead of A's on the global schedule
    lines = [(A, "x")] * 3 + [(B, "y")] * 2
    tasks = [asyncio.create_task(paced(pacer, h, pipeline=p)) for h, p in lines]
    try:
        await asyncio.sleep(0.5)  # A's first went at T0; its second holds the slot reserved for T0 + 1
        snap = pacer.snapshot()
        assert snap.at - T0 == 0.5 and snap.grants == 1
        assert snap.queued == 3 and snap.lines == {("x", A): 1, ("y", B): 2}
        assert snap.ready_in == {B: 3.5} and snap.hosts == {A, B}
        live = pacer._state
        for pipeline in ("x", "y", "z"):
            for host in (A, B):
                want = max(0.0, live.estimate(host, snap.at, snap.gap, 0.0, pipeline))
                assert snap.expected_wait(pipeline, host) == want, (pipeline, host)
        assert snap.expected_wait("y", B) >= 3.5  # behind B's rest
        tasks.append(asyncio.create_task(paced(pacer, A, pipeline="x")))
        await asyncio.sleep(0)
        assert pacer.snapshot().lines[("x", A)] == 2 and snap.lines[("x", A)] == 1  # the old copy stands
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pacer.close()


async def test_reload_applies_at_once() -> None:
    pacer = Pacer(MemoryStore(rand=lambda: 0.0), settings(exempt_max_in_flight=1))
    try:
        pacer.reload(settings(gap=0.0, exempt_max_in_flight=3))
        assert pacer.snapshot().gap == 0.0 and pacer.settings.exempt_max_in_flight == 3
        async with pacer.permit(A, Klass.EXEMPT), pacer.permit(A, Klass.EXEMPT):
            assert pacer.snapshot().exempt_in_flight == {A: 2}
        assert pacer.snapshot().exempt_in_flight == {}
    finally:
        await pacer.close()
